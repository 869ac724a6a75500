"""tests/quick_suite.txt, the quick suite's list: every line names a test file that exists and,
where it names a test, a test function defined in that file (so a renamed test is noticed
here, not silently dropped from the quick suite)."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def quick_suite() -> list[str]:
    """The node ids of tests/quick_suite.txt."""
    with open(os.path.join(ROOT, "tests", "quick_suite.txt")) as f:
        return [line.split("#", 1)[0].strip() for line in f if line.split("#", 1)[0].strip()]


def test_every_entry_names_an_existing_test():
    entries = quick_suite()
    assert len(entries) == len(set(entries)) > 20
    for entry in entries:
        path, _, name = entry.partition("::")
        assert path.startswith("tests/") and os.path.isfile(os.path.join(ROOT, path)), entry
        if name:
            source = open(os.path.join(ROOT, path)).read()
            assert re.search(rf"^def {re.escape(name)}\(", source, re.M), entry


def test_every_test_folder_has_a_quick_test():
    covered = {os.path.dirname(e.partition("::")[0]) for e in quick_suite()}
    folders = {os.path.relpath(d, ROOT) for d, _, files in os.walk(os.path.join(ROOT, "tests"))
               if any(f.startswith("test_") and f.endswith(".py") for f in files)}
    # (partial_swap: one measurement script, whose only test runs it: slow)
    assert folders - covered <= {"tests/backends", "tests/train/workloads", "tests/experiments/partial_swap"}, \
        folders - covered
