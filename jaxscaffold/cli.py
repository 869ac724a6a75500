"""Console commands for the launchers (`pip install -e .` puts them on PATH):

  jaxscaffold-train --config fee.py      = python launch/tpu_train.py --config fee.py
  jaxscaffold-eval, jaxscaffold-export, jaxscaffold-plan, jaxscaffold-serve, jaxscaffold-study,
  jaxscaffold-bench, jaxscaffold-demo    = launch/eval.py, export_hf.py, plan.py, serve_chat.py,
                                           study.py, bench.py, demo.py

The launchers and `configs/` live in the checkout beside this package, so each command runs its
script from there, exactly as `python launch/<script>` does; an install without the checkout
(a plain wheel) has no launchers and says so in one line.
"""

from __future__ import annotations

import functools
import os
import runpy
import sys

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = {"train": "tpu_train.py", "eval": "eval.py", "export": "export_hf.py", "plan": "plan.py",
           "serve": "serve_chat.py", "study": "study.py", "bench": "bench.py", "demo": "demo.py"}


def run(command: str, argv: list[str] | None = None) -> None:
    """Runs `launch/<script>` of the checkout as `__main__` with `argv` (default: this
    process's arguments)."""
    script = os.path.join(CHECKOUT, "launch", SCRIPTS[command])
    if not os.path.isfile(script):
        print(f"error: jaxscaffold-{command} runs {os.path.join('launch', SCRIPTS[command])} of a checkout, and "
              f"{CHECKOUT} has none: install from a clone (`pip install -e .`)", file=sys.stderr)
        sys.exit(2)
    sys.argv = [script, *(sys.argv[1:] if argv is None else argv)]
    runpy.run_path(script, run_name="__main__")


# The console commands (pyproject.toml's [project.scripts]).
train, evaluate, export, plan, serve, study, bench, demo = (
    functools.partial(run, name) for name in ("train", "eval", "export", "plan", "serve", "study", "bench", "demo"))
