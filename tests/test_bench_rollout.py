"""`launch/bench.py rollout`: its bound and ratios computed by hand and from the latency env's
own reported sleeps, its arguments, and (slow) a short run printing every figure."""

import dataclasses
import json
import os
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "launch"))

from benchmarks import rollout  # noqa: E402
from jaxscaffold import config as config_lib  # noqa: E402
from jaxscaffold.envs import latency  # noqa: E402


def test_bound_ratios_and_steps_per_hour_by_hand():
    assert rollout.chain_s(5, 1.5, 0.2) == pytest.approx(2.5)
    assert rollout.bound_s(3.0, [2.5, 1.0]) == 3.0  # decode-bound
    assert rollout.bound_s(2.0, [2.5, 1.0]) == 2.5  # chain-bound
    assert rollout.ratios(10.0, 3.0, 2.5) == {"async_over_lockstep": pytest.approx(0.3),
                                              "async_over_bound": pytest.approx(1.2)}
    # steps 2..4 took 30 s after step 1 ended at 12 s: 3 steps in 30 s
    assert rollout.steps_per_hour([12.0, 22.0, 32.0, 42.0]) == pytest.approx(360.0)
    with pytest.raises(ValueError, match="two steps"):
        rollout.steps_per_hour([5.0])


def test_the_chain_of_an_episode_is_its_turns_and_the_sleeps_its_env_reported():
    kw = {"median_ms": 10.0, "p99_ms": 40.0, "min_turns": 2, "max_turns": 5}
    env = latency.LatencyEnv(**kw)
    task = latency.catalogue("train", 4)[3]
    env.reset(task)
    actions, slept = [], 0.0
    for k in range(5):
        r = env.step(f"answer {k}")
        actions.append(r.action)
        slept += r.info["latency_s"]
        if r.done:
            break
    turns, sleeps = latency.draws(task.seed, actions, **kw)
    assert len(actions) == turns
    assert rollout.chain_s(len(actions), sum(sleeps), 0.05) == pytest.approx(0.05 * turns + slept)


def test_arguments_and_config():
    args = rollout.parse_args([])
    assert (args.latency_ms, args.latency_p99_ms, args.turns, args.rows) == (200.0, 2000.0, (2, 14), 64)
    assert rollout.parse_args(["--turns", "3-3"]).turns == (3, 3)
    for bad in (["--turns", "5-2"], ["--turns", "x"], ["--rows", "12"], ["--latency-ms", "300", "--latency-p99-ms", "200"],
                ["--staleness", "1"]):
        with pytest.raises(SystemExit):
            rollout.parse_args(bad)
    cfg = config_lib.typed(rollout.config(rollout.parse_args(["--rows", "16", "--turns", "2-6"]), "/tmp/unused"))
    assert (cfg.rollout.tasks_per_step, cfg.rollout.group_size, cfg.rollout.max_turns) == (2, 8, 6)
    assert json.loads(cfg.envs.env_kwargs)["latency"] == {"median_ms": 200.0, "p99_ms": 2000.0, "min_turns": 2,
                                                          "max_turns": 6}
    zero = config_lib.typed(rollout.config(rollout.parse_args([]), "/tmp/unused", scale=0.0))
    assert json.loads(zero.envs.env_kwargs)["latency"]["median_ms"] == 0.0


def test_no_run_folder_is_left_behind_also_on_error(tmp_path, monkeypatch):
    """The rollouts and the training steps each run in a temporary folder; a run that fails
    (here its config: no tokens a turn) removes it too."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made, original = [], rollout.config

    def no_tokens(args, out_dir, scale=1.0):
        made.append(out_dir)
        c = original(args, out_dir, scale)
        c.rollout.max_new_tokens = 0
        return c

    monkeypatch.setattr(rollout, "config", no_tokens)
    with pytest.raises(config_lib.ConfigError, match="max_new_tokens"):
        rollout.rollouts(rollout.parse_args([]))
    with pytest.raises(config_lib.ConfigError, match="max_new_tokens"):
        rollout.training_steps(rollout.parse_args(["--staleness", "1", "--steps", "2"]))
    assert [os.path.basename(p).split("-")[1] for p in made] == ["rollout", "steps"]
    assert all(os.path.dirname(p) == str(tmp_path) for p in made)
    assert list(tmp_path.iterdir()) == []
    with rollout.scratch_dir("bench-x-") as path:
        assert os.path.isdir(path)
    assert not os.path.exists(path)


@pytest.mark.slow
def test_a_short_run_prints_every_figure(tmp_path):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "bench.py"), "rollout", "--quick", "--json",
                          "--workers", "2"], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PYTHONPATH": ROOT, "TMPDIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert not list(tmp_path.glob("bench-*"))  # the run's folder is removed
    figures = {f["name"]: f for f in map(json.loads, out.stdout.splitlines())}
    lock, bound = figures["lockstep_s"], figures["bound_s"]
    assert figures["compile_ahead_s"]["programs"] > 0 and lock["prefill_calls"] > 0
    assert lock["episodes"] == 8 and lock["failures"] == 0 and 1 <= lock["lockstep_turns"] <= 3
    assert bound["value"] == pytest.approx(max(bound["decode_s"], bound["longest_chain_s"]), abs=1e-3)
    if "async_s" in figures:
        a = figures["async_s"]["value"]
        assert figures["async_over_lockstep"]["value"] == pytest.approx(a / lock["value"], rel=1e-2)
        assert figures["async_over_bound"]["value"] == pytest.approx(a / bound["value"], rel=1e-2)
        assert figures["async_s"]["same_actions"] >= 0.75  # the same tokens, up to ties batch shape can flip


def test_own_seconds_per_call_of_lock_step_pool_calls():
    # 8 episodes on 2 workers took 4 s (4 each, one after the other: 1 s own); then 1 episode 0.5 s
    assert rollout.own_seconds_per_call([(4.0, 8), (0.5, 1)], workers=2) == pytest.approx((4.0 * 2 + 0.5) / 9)
    assert rollout.own_seconds_per_call([], workers=2) == 0.0
