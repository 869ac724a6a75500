"""`launch/eval.py --policy gold`: each benchmark's gold path wins through the agent's code path
(the env pool, the adapters, the same action text an agent writes)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _eval(env, split, limit, extra_env=None):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "eval.py"), "--env", env, "--split", split,
                          "--policy", "gold", "--limit", str(limit), "--json"],
                         capture_output=True, text=True, timeout=600, env={**os.environ, **(extra_env or {})})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_gold_policy_wins_bfcl_and_sciworld():
    for env, split, n in (("bfcl", "validation", 8), ("sciworld", "test", 4)):
        report = _eval(env, split, n)
        assert report == {"env": env, "split": split, "episodes": n, "success_rate": 1.0}


@pytest.mark.slow
def test_gold_policy_wins_alfworld(alfworld_data):
    report = _eval("alfworld", "valid_unseen", 6, {"ALFWORLD_DATA": str(alfworld_data.root)})
    assert report["episodes"] == 6 and report["success_rate"] == 1.0


def test_unknown_env_is_a_clear_error():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "eval.py"), "--env", "nope", "--split", "x"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "unknown environment 'nope'" in out.stderr


@pytest.mark.slow
def test_gold_policy_wins_the_rooms_testbed():
    assert _eval("rooms", "test", 16) == {"env": "rooms", "split": "test", "episodes": 16, "success_rate": 1.0}
