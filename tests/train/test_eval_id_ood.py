"""`configs/rwml_policy.py` evaluates ALFWorld in- and out-of-distribution in one run: both
splits' games in its evaluation set, each split's success reported apart (the gold policy
through `launch/eval.py`, the code path training's evaluation shares)."""

import json
import os
import subprocess
import sys

from tests.envs.conftest import alfworld_data  # noqa: F401  (shared fixtures)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_rwml_policy_evaluates_valid_seen_and_valid_unseen_in_one_run(alfworld_data):  # noqa: F811
    run = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "eval.py"), "--config", "rwml_policy.py",
                          "--config.eval.tasks=2", "--policy", "gold", "--json"],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "ALFWORLD_DATA": str(alfworld_data.root)})
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["episodes"] == 4 and report["failures"] == 0
    m = report["metrics"]
    assert m["eval/success_alfworld/valid_seen"] == 1.0 and m["eval/success_alfworld/valid_unseen"] == 1.0
    assert m["eval/success_alfworld"] == 1.0
