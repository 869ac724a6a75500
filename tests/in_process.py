"""`run_script`: a script run as `python SCRIPT ARGS` would run it, but inside the test process.

Why: tests run the launchers (launch/*.py) and the docs' commands as a user types them, and a
process of their own costs a start and its imports (jax, and torch and transformers for the
export) each time. Run here, those are shared with the rest of the suite. Every such script is
also run as a real command by some test (tests/train/test_startup.py, test_trainer.py,
tests/envs/test_eval_gold.py), so a difference between the two ways would still be seen."""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import sys
from typing import NamedTuple

import pytest


class Result(NamedTuple):
    """The exit status the script's process would have had, and what it printed (when captured)."""

    code: int
    out: str
    err: str


def run_script(path, args=(), *, cwd=None, sys_path=(), capture=False) -> Result:
    """Runs the script at `path` with arguments `args` as python would in `cwd` (default: the
    current directory): as `__main__`, with `[path, *args]` in sys.argv and, first on sys.path,
    the script's folder then `sys_path` (what PYTHONPATH would add). sys.argv, sys.path and the
    working directory are restored afterwards; the modules it imports stay imported, as a test's
    imports do. With `capture`, its stdout and stderr are returned instead of printed.

    A `sys.exit` ends it with python's exit status (None: 0, a message: 1, the message printed
    to stderr); any other exception propagates, so the test fails with its traceback."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.ExitStack() as streams:
        patch.chdir(os.getcwd() if cwd is None else cwd)  # (and back afterwards, whatever the script does)
        patch.setattr(sys, "argv", [str(path), *map(str, args)])
        # The script's real folder, as python resolves it (a symlinked launch/ gives the checkout's).
        for folder in reversed([os.path.dirname(os.path.realpath(path)), *map(str, sys_path)]):
            patch.syspath_prepend(folder)  # (restores the whole of sys.path, the script's own edits too)
        if capture:
            streams.enter_context(contextlib.redirect_stdout(out))
            streams.enter_context(contextlib.redirect_stderr(err))
        code = exit_status(str(path))
    return Result(code, out.getvalue(), err.getvalue())


def exit_status(path: str) -> int:
    """Runs `path` as `__main__`; the status its process would exit with (an exception other
    than SystemExit propagates)."""
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    return 0
