"""The launchers speak the same way: bad input is one line and exit code 2; what a run did is
said in words (why an evaluation episode was lost, why `plan.py --search` stopped)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from jaxscaffold.envs import bfcl, registry
from jaxscaffold.envs.gold import GOLD_ENV_KWARGS
from jaxscaffold.envs.local import LocalEnvs
from jaxscaffold.episodes.agents import GoldAgent
from jaxscaffold.episodes.driver import run_episodes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _launcher(name):
    """launch/NAME.py as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(f"launch_{name}", os.path.join(ROOT, "launch", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gold_policy_losing_bfcl_154_says_why():
    # multi_turn_base_154 has 5 user turns and 6 gold turns: BFCL scores it force-terminated.
    tasks = {t.task_id: t for t in bfcl.catalogue("validation", categories=("base",))}
    chosen = [tasks["multi_turn_base_154"], tasks["multi_turn_base_100"]]
    envs = LocalEnvs({"bfcl": registry.factory("bfcl", **GOLD_ENV_KWARGS["bfcl"])})
    lost, won = run_episodes(GoldAgent(), envs, chosen, max_turns=200)
    envs.close()
    eval_py = _launcher("eval")
    assert not lost.won and lost.failure is None and won.won and won.end_reason == ""
    line = eval_py.episode_line(eval_py.record(lost))
    assert "lost (gold_turn_mismatch: the entry has 5 user turns but 6 gold turns" in line, line
    assert eval_py.episode_line(eval_py.record(won)).endswith(", won")


def test_a_lost_episode_without_the_envs_reason_shows_how_it_ended():
    eval_py = _launcher("eval")
    base = {"env": "sciworld", "task_id": "t", "category": "", "reward": 0.0, "steps": 3, "won": False,
            "failed": False, "failure": None, "end_reason": "", "truncated": False,
            "observations": ["You are in the kitchen.", "The stove is\n  off.", ""]}
    assert eval_py.episode_line(base).endswith("lost (ended without a win; last observation: 'The stove is off.')")
    assert eval_py.episode_line(dict(base, truncated=True)).endswith("lost (out of turns)")
    assert eval_py.episode_line(dict(base, failed=True, failure="env crashed")).endswith("FAILED (env crashed)")


@pytest.mark.parametrize("flag, says", [("--hf", "checkpoint directory not found: /no/such/model (model.hf_path"),
                                         ("--checkpoint", "no checkpoint directory at /no/such/model")])
def test_eval_with_a_missing_model_is_one_line(flag, says, monkeypatch, capsys):
    """(eval.py's main in this process, saving a process start; tests/envs/test_eval_gold.py
    runs eval.py as a command, its bad input included.)"""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "launch"))  # eval.py imports tpu_train from its folder
    eval_py = _launcher("eval")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        eval_py.main(["--env", "letters", "--split", "test", "--policy", "model", flag, "/no/such/model",
                      "--workers", "0"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and says in err, err[-3000:]


def test_a_study_with_a_missing_base_model_is_one_line(tmp_path):
    study = tmp_path / "study.py"
    study.write_text(
        "def get_study():\n"
        f"    return {{'name': 'missing_base', 'out_dir': {str(tmp_path / 'runs')!r}, 'seeds': [0],\n"
        f"            'arms': {{'a': ('tiny.py', ['model.hf_path={tmp_path / 'no_base'}', 'steps=1'])}}}}\n")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "study.py"), "--study", str(study)],
                         capture_output=True, text=True, timeout=300)
    errors = [line for line in out.stderr.splitlines() if not line.startswith("INFO:")]
    assert out.returncode == 2 and len(errors) == 1, out.stderr[-3000:]
    assert errors[0].startswith("error: checkpoint directory not found: ") and errors[0].endswith(
        "no_base (model.hf_path: a local HF checkpoint directory or a hub id such as 'Qwen/Qwen3-4B')")


@pytest.mark.slow  # compiles the tiny train step once per micro-batch count (5 of them)
def test_plan_search_says_why_it_stopped():
    cmd = [sys.executable, os.path.join(ROOT, "launch", "plan.py"), "--config", "tiny.py", "--devices", "2",
           "--search", "--json"]
    env = {**os.environ, "XLA_FLAGS": os.environ["JAXSCAFFOLD_TEST_XLA_FLAGS"]}  # (plan.py adds its devices)
    fits = subprocess.run(cmd + ["--hbm-gb", "16"], capture_output=True, text=True, env=env, timeout=600)
    assert fits.returncode == 0, fits.stderr[-2000:]
    assert json.loads(fits.stdout.splitlines()[-1])["search"] == "the train phase fits with rl.micro_batches=1"
    never = subprocess.run(cmd + ["--hbm-gb", "0.01"], capture_output=True, text=True, env=env, timeout=600)
    report = json.loads(never.stdout.splitlines()[-1])
    assert never.returncode == 1 and report["micro_batches"] == 16  # 32 rows over 2 devices: one row each
    assert report["search"].startswith("the train phase does not fit even at rl.micro_batches=16, one row per device")
