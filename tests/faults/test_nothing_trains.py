"""Runs where nothing trains fail instead of reporting success: every episode failing, or
every update non-finite, for rl.max_empty_steps / rl.max_bad_steps steps in a row stops the
run with one line (the failures counted by kind, one example each; the last checkpoint), exit 1
through the launcher. Per-episode failures are one warning line a step."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from jaxscaffold.train.checkpoint import saved_steps
from jaxscaffold.train.failures import RunFailed, StepGuard, summarise_failures
from jaxscaffold.train.trainer import train
from jaxscaffold.train.workloads.env_rl import EnvWorkload
from tests.train.configs import tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def episode(failure=None):
    return SimpleNamespace(failure=failure)


def test_the_guard_counts_consecutive_steps_only(caplog):
    guard = StepGuard(max_bad_steps=2, max_empty_steps=3)
    failed = [episode("reset timeout: 180 s"), episode("context: a first prompt of 900 tokens"),
              episode("reset timeout: 181 s")]
    with caplog.at_level(logging.WARNING, logger="jaxscaffold"):
        guard.after_collect(1, failed, rows=0)
        guard.after_collect(2, failed, rows=0)
        guard.after_collect(3, [episode(), *failed[:1]], rows=1)  # a step that trains resets the count
        guard.after_collect(4, failed, rows=0)
        guard.after_collect(5, failed, rows=0)
        with pytest.raises(RunFailed, match=r"nothing trained for 3 steps in a row \(rl\.max_empty_steps=3\), up to "
                                            r"step 6: 6 x reset timeout \(e\.g\. reset timeout: 180 s\), "
                                            r"3 x context \(e\.g\. context: a first prompt of 900 tokens\)$"):
            guard.after_collect(6, failed, rows=0)
    step_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(("step 1 ", "step 3:"))]
    assert step_lines == ["step 1 trained nothing (3 of 3 episodes failed: 2 x reset timeout (e.g. reset timeout: "
                          "180 s), 1 x context (e.g. context: a first prompt of 900 tokens); 1 of "
                          "rl.max_empty_steps=3 in a row)",
                          "step 3: 1 of 2 episodes failed: 1 x reset timeout (e.g. reset timeout: 180 s)"]
    guard.after_update(1, {"train/skipped": 1.0, "train/loss": float("nan")})
    guard.after_update(2, {"train/skipped": 0.0})
    guard.after_update(3, {"train/skipped": 0.5})
    with pytest.raises(RunFailed, match=r"2 steps in a row up to step 4 had a non-finite loss or gradient norm"):
        guard.after_update(4, {"train/skipped": 1.0})


def test_summary_counts_by_kind():
    assert summarise_failures(["a: 1", "b: 2", "a: 3"]) == "2 x a (e.g. a: 1), 1 x b (e.g. b: 2)"


def test_every_episode_failing_stops_the_run(tmp_path, caplog):
    """The issue's `rollout.max_len=20`: no first prompt fits, every episode fails."""
    cfg = tiny_config(tmp_path, steps=5, **{"rollout.max_len": 20, "rl.max_empty_steps": 2, "eval.every": 0,
                                            "checkpoint.every": 1})
    with caplog.at_level(logging.WARNING, logger="jaxscaffold"):
        with pytest.raises(RunFailed) as e:
            train(cfg)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("nothing trained for 2 steps in a row (rl.max_empty_steps=2), up to step 2: 16 x context "
                              "(e.g. context: a first prompt of "), message
    assert message.endswith(f"last checkpoint: step 1 in {tmp_path / 'checkpoints'}"), message
    step_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step 1 ")]
    assert len(step_lines) == 1 and step_lines[0].startswith("step 1 trained nothing (8 of 8 episodes failed: 8 x context")
    assert not [r for r in caplog.records if r.getMessage().startswith("episode ")]  # no line per episode
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


class Poisoned(EnvWorkload):
    """From step 2 on every episode's reward is infinite: the advantages and the loss are NaN."""

    def collect(self, job, params, step):
        episodes, stats = super().collect(job, params, step)
        if step >= 2:
            for e in episodes:
                e.reward = float("inf")
        return episodes, stats


def test_non_finite_updates_are_skipped_and_stop_the_run(tmp_path):
    # On the word vocabulary: a poisoned reward's NaN does not depend on Qwen3's.
    cfg = tiny_config(tmp_path, steps=5, words=True, **{"rl.max_bad_steps": 2, "eval.every": 0, "checkpoint.every": 1})
    first = train(tiny_config(tmp_path, steps=1, words=True, **{"eval.every": 0, "checkpoint.every": 1}))
    after_1 = [np.asarray(x) for x in jax.tree.leaves(first["state"].params)]
    with pytest.raises(RunFailed, match=r"^2 steps in a row up to step 3 had a non-finite loss or gradient norm "
                                        r"\(rl\.max_bad_steps=2\).*; last checkpoint: step 2 in ") as e:
        train(cfg, workload=Poisoned)
    assert "\n" not in str(e.value)
    assert saved_steps(str(tmp_path / "checkpoints")) == [1, 2]  # nothing saved after the failure
    from jaxscaffold.train.checkpoint import Checkpointer
    ckpt = Checkpointer(str(tmp_path / "checkpoints"), reader=True)
    saved = ckpt.read_params(first["state"].params, 2)  # step 2's update was skipped: step 1's parameters
    for a, b in zip(jax.tree.leaves(saved), after_1):
        np.testing.assert_array_equal(np.asarray(a), b)
    ckpt.close()


@pytest.mark.slow
def test_launcher_exit_1_and_one_error_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "launch", "tpu_train.py"), "--config", "tiny.py",
         f"--config.out_dir={tmp_path}", "--config.steps=4", "--config.rollout.max_len=20",
         "--config.rl.max_empty_steps=2", "--config.eval.every=0", "--config.envs.num_workers=0",
         "--config.rollout.tasks_per_step=2", "--config.rollout.group_size=2", "--config.rollout.max_new_tokens=8",
         "--config.mesh.devices=1"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "nothing trained for 2 steps in a row" in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "[done]" not in proc.stdout
