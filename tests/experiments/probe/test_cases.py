"""The probe's cases: the 8 file-system operations OE lists the directory after, each output the
enriched text of the real env's call, checked against the file system's own state."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("bfcl_eval")

from jaxscaffold.envs import bfcl  # noqa: E402
from jaxscaffold.feedback.bfcl_oe import FS_CHANGING  # noqa: E402
from experiments.probe.cases import PROBE_ENTRY, probe_cases  # noqa: E402

# The listing of /alex/workspace after each operation, from the entry's initial_config by hand:
# log.txt, archive/ (empty) and .hidden_file (hidden: `ls()` leaves it out).
START = ["log.txt", "archive"]
LISTING = {"cd": START, "mkdir": START + ["reports"], "touch": START + ["todo.txt"], "rm": ["archive"],
           "rmdir": ["log.txt"], "mv": ["archive"], "cp": START, "echo": START}


def test_cases_are_the_8_operations_with_their_enriched_outputs():
    cases = probe_cases()
    assert sorted(c.operation for c in cases) == sorted(FS_CHANGING) and len(cases) == 8
    entry, _ = bfcl.load_entry("base", int(PROBE_ENTRY.rsplit("_", 1)[1]))
    assert set(entry["initial_config"]["GorillaFileSystem"]["root"]["alex"]["contents"]["workspace"]["contents"]) \
        == set(START) | {".hidden_file"}
    for c in cases:
        out = json.loads(c.output)
        assert out["_current_path"] == "/alex/workspace", c.operation
        assert sorted(out["_directory_contents"]) == sorted(LISTING[c.operation]), c.operation
        if c.operation in ("mkdir", "touch", "echo"):  # a None result becomes OE's success text
            assert out["observation"] == f"Command '{c.operation}' completed successfully."
        # the chat: system, request, then (call, output) pairs, the probed call last
        roles = [m["role"] for m in c.messages]
        assert roles[:2] == ["system", "user"] and roles[2:] == ["assistant", "tool"] * ((len(roles) - 2) // 2)
        assert c.messages[-2]["tool_calls"][0]["name"] == c.operation
        assert any(t["function"]["name"] == c.operation for t in c.tools)
    assert probe_cases() == cases  # deterministic
