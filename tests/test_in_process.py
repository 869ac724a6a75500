"""tests/in_process.py's `run_script`: a script sees what `python SCRIPT ARGS` would show it, its
exit status comes back, and the process's state is as before."""

from __future__ import annotations

import json
import os
import sys

from tests.in_process import run_script

SCRIPT = """\
import json, os, sys
print(json.dumps({"name": __name__, "argv": sys.argv, "path": sys.path[:2], "cwd": os.getcwd()}))
print("to stderr", file=sys.stderr)
sys.path.insert(0, "/nowhere")  # undone afterwards too
os.chdir("/")
sys.exit(CODE)
"""


def write_script(folder, code) -> str:
    folder.mkdir(exist_ok=True)
    path = folder / "script.py"
    path.write_text(SCRIPT.replace("CODE", code))
    return str(path)


def test_the_script_runs_as_main_with_its_argv_path_and_cwd(tmp_path):
    script = write_script(tmp_path / "bin", "None")
    (tmp_path / "work").mkdir()
    before = (list(sys.argv), list(sys.path), os.getcwd(), sys.modules["__main__"])
    result = run_script(script, ["--a", 1], cwd=tmp_path / "work", sys_path=[tmp_path], capture=True)
    assert (list(sys.argv), list(sys.path), os.getcwd(), sys.modules["__main__"]) == before
    assert result.code == 0 and result.err == "to stderr\n"
    seen = json.loads(result.out)
    assert seen == {"name": "__main__", "argv": [script, "--a", "1"], "path": [str(tmp_path / "bin"), str(tmp_path)],
                    "cwd": str(tmp_path / "work")}


def test_a_relative_path_is_the_cwd_s_and_uncaptured_output_is_printed(tmp_path, capsys):
    """(Through a linked folder, as the README's `launch/`: python puts the real folder on sys.path.)"""
    write_script(tmp_path / "bin", "0")
    (tmp_path / "link").symlink_to(tmp_path / "bin")
    before = os.getcwd()
    result = run_script("link/script.py", cwd=tmp_path)
    assert result == (0, "", "") and os.getcwd() == before
    printed = capsys.readouterr()
    assert '"argv": ["link/script.py"]' in printed.out and printed.err == "to stderr\n"
    assert f'"path": ["{tmp_path / "bin"}", ' in printed.out


def test_exit_statuses_are_pythons(tmp_path):
    before = (list(sys.argv), list(sys.path), os.getcwd())
    for code, status, err in (("3", 3, ""), ("'bad input'", 1, "bad input\n"), ("False", 0, "")):
        result = run_script(write_script(tmp_path / "bin", code), capture=True)
        assert (result.code, result.err.removeprefix("to stderr\n")) == (status, err), code
        assert (list(sys.argv), list(sys.path), os.getcwd()) == before
