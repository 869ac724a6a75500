"""The study runner: every config checked before a run starts, runs resumable and shardable,
the report from the runs' histories; and one real study of tiny training runs."""

import json
import os
import subprocess
import sys

import pytest

from jaxscaffold import config as config_lib
from jaxscaffold.studies import report, runner

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "configs")
QUICK = ["steps=1", "eval.every=1", "eval.at_start=false", "eval.tasks=4", "eval.max_len=0", "envs.eval=letters", "envs.num_workers=0",
         "rollout.tasks_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=8", "mesh.devices=1",
         "checkpoint.every=1"]


def _study_file(tmp_path, arms, seeds=(0, 1), extra=""):
    path = tmp_path / "study.py"
    path.write_text(f"def get_study():\n    return {{'name': 't', 'out_dir': {str(tmp_path / 'out')!r}, "
                    f"'seeds': {list(seeds)!r}, 'score': 'eval/success', 'arms': {arms!r}{extra}}}\n")
    return str(path)


def _fake_history(cfg):
    """A deterministic history of a run (the runner's own logic is under test here)."""
    bonus = 0.2 if "lr_high" in cfg.out_dir else 0.0
    return [{"step": s, "rollout/reward": 0.1 * s + bonus, "eval/success": 0.1 * s + bonus + 0.01 * cfg.seed,
             "rollout/informative_groups": 0.5} for s in (1, 2, 3)]


def test_runs_are_resumable_shardable_and_reported(tmp_path, caplog):
    caplog.set_level("INFO", logger="jaxscaffold.studies.runner")
    arms = {"base": ("tiny.py", QUICK), "lr_high": ("tiny.py", QUICK + ["rl.lr=0.1"])}
    study = runner.load_study(_study_file(tmp_path, arms, seeds=(0, 1, 2), extra=", 'baseline': 'base'"))
    calls = []
    train = lambda cfg: calls.append((cfg.out_dir, cfg.seed)) or _fake_history(cfg)  # noqa: E731
    first = runner.run_study(study, CONFIGS, shard=(0, 2), train=train)
    second = runner.run_study(study, CONFIGS, shard=(1, 2), train=train)
    assert sorted(first + second) == sorted(study.runs()) and not set(first) & set(second)
    finished_lines = [r.getMessage() for r in caplog.records if "finished in" in r.getMessage()]
    assert len(finished_lines) == 6  # one per run: its time and the process's peak memory
    gb = [float(m.rsplit("peak resident ", 1)[1].split()[0]) for m in finished_lines]
    assert gb == sorted(gb) and 0 < gb[-1] <= runner.peak_resident_gb() + 0.005  # a peak never falls (2 decimals)
    assert runner.run_study(study, CONFIGS, train=train) == []  # everything finished: nothing reruns
    assert len(calls) == 6 and {s for _, s in calls} == {0, 1, 2}
    summary = report.write_report(study)
    assert summary["arms"]["lr_high"]["peak"]["mean"] == pytest.approx(0.3 + 0.2 + 0.01)
    paired = summary["paired_vs_baseline"]["lr_high"]["final"]
    assert paired["mean"] == pytest.approx(0.2) and paired["seeds"] == [0, 1, 2] and paired["excludes_zero"]
    assert os.path.exists(tmp_path / "out" / "study.png") and not summary["missing"]


def test_a_bad_arm_is_found_before_any_run(tmp_path):
    arms = {"ok": ("tiny.py", QUICK), "bad": ("tiny.py", QUICK + ["rl.algorithm=ppo"])}
    study = runner.load_study(_study_file(tmp_path, arms))
    with pytest.raises(config_lib.ConfigError, match="arm bad: .*not one of"):
        runner.run_study(study, CONFIGS, train=lambda cfg: pytest.fail("a run started"))
    for bad, message in (("{'x': 1}", "missing"), ):
        path = tmp_path / "bad.py"
        path.write_text(f"def get_study():\n    return {bad}\n")
        with pytest.raises(runner.StudyError, match=message):
            runner.load_study(str(path))


@pytest.mark.slow
def test_a_real_study_of_tiny_runs_through_the_launcher(tmp_path):
    quick = QUICK + ["model.vocabulary=rooms"]  # the word vocabulary: the runner's work does not depend on Qwen3's
    arms = {"grpo": ("tiny.py", quick), "drgrpo": ("tiny.py", quick + ["rl.algorithm=drgrpo"])}
    path = _study_file(tmp_path, arms, extra=", 'baseline': 'grpo'")
    cmd = [sys.executable, os.path.join(ROOT, "launch", "study.py"), "--study", path, "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    for arm in arms:
        for seed in (0, 1):
            history = json.load(open(tmp_path / "out" / arm / f"seed_{seed}" / "run.json"))["history"]
            assert [h["step"] for h in history] == [1]
            assert summary["arms"][arm]["runs"][str(seed)]["final"] == history[-1]["eval/success"]
    assert summary["paired_vs_baseline"]["drgrpo"]["final"]["seeds"] == [0, 1]
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)  # resumed: nothing reruns
    assert again.returncode == 0 and json.loads(again.stdout.strip().splitlines()[-1]) == summary
    tables = tmp_path / "tables.md"  # --report alone: the tables of the finished runs, nothing trains
    reported = subprocess.run([*cmd[:-1], "--report", "--markdown", str(tables)], capture_output=True, text=True,
                              timeout=600)
    assert reported.returncode == 0, reported.stderr[-3000:]
    assert tables.read_text() == report.markdown(summary) and "| drgrpo | 2 |" in tables.read_text()
