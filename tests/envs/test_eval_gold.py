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
        assert report == {"env": env, "split": split, "episodes": n, "failures": 0, "success_rate": 1.0}


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
    assert _eval("rooms", "test", 16) == {"env": "rooms", "split": "test", "episodes": 16, "failures": 0, "success_rate": 1.0}


def test_per_episode_lines_trajectories_and_levels(tmp_path):
    """A line per episode, --out with each trajectory, a ScienceWorld level in the split."""
    out = tmp_path / "episodes.jsonl"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "eval.py"), "--env", "rooms", "--split", "test",
                          "--policy", "gold", "--limit", "3", "--workers", "1", "--out", str(out), "--json"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.strip().splitlines()
    assert sum(line.startswith("rooms test-") and ", won" in line for line in lines) == 3
    records = [json.loads(line) for line in open(out)]
    assert [r["task_id"] for r in records] == ["test-0", "test-1", "test-2"]
    for r in records:
        assert r["won"] and not r["failed"] and len(r["observations"]) == r["steps"] + 1 == len(r["actions"]) + 1
    listed = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "eval.py"), "--env", "sciworld", "--split",
                             "L1/test", "--list-tasks"], capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) > 100, listed.stderr[-500:]
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "eval.py"), "--env", "sciworld", "--split",
                          "L9/test"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "level" in bad.stderr


@pytest.mark.slow
def test_model_policy_from_a_checkpoint_with_overrides(tmp_path):
    """`--policy model --checkpoint`: the checkpoint's config with the command line's overrides
    (here a 3-token reply), each episode's decoded conversation in --out."""
    from jaxscaffold.models.tokenizer import load_tokenizer
    from jaxscaffold.train.trainer import train
    from tests.train.configs import tiny_config
    train(tiny_config(tmp_path / "run", steps=1, **{"eval.every": 0, "checkpoint.every": 1}))
    out = tmp_path / "episodes.jsonl"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "eval.py"), "--config", "tiny.py",
                          "--config.envs.eval=letters:test:4", "--config.eval.tasks=4", "--config.rollout.max_new_tokens=3",
                          "--policy", "model", "--checkpoint", str(tmp_path / "run"), "--workers", "0",
                          "--out", str(out), "--json"], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["episodes"] == 4 and report["failures"] == 0
    tok = load_tokenizer(None)
    for r in map(json.loads, open(out)):
        assert r["env"] == "letters" and r["conversation"].startswith("<|im_start|>")
        reply = r["conversation"].rsplit("<|im_start|>assistant\n", 1)[1].split("</think>\n\n")[-1]
        assert 1 <= len(tok.encode(reply.replace("<|im_end|>", ""))) <= 3  # thinking off: an empty block first
