"""The latency env: its sleeps have the asked median and p99, its lengths are uniform over the
asked range, both are reproducible from the actions, and it runs in the pool's workers."""

from __future__ import annotations

import time

import numpy as np
import pytest

from jaxscaffold.envs import latency, registry
from jaxscaffold.envs.base import is_failure
from jaxscaffold.envs.pool import EnvPool


def test_sleeps_have_the_asked_median_and_p99():
    draws = np.array([latency.step_latency_s(seed, 0, f"action {seed}", 0.2, 2.0) for seed in range(40_000)])
    assert np.median(draws) == pytest.approx(0.2, rel=0.03)
    assert np.quantile(draws, 0.99) == pytest.approx(2.0, rel=0.08)
    assert latency.step_latency_s(3, 1, "x", 0.0, 0.0) == 0.0
    # a point mass when p99 == median
    assert latency.step_latency_s(3, 1, "x", 0.1, 0.1) == pytest.approx(0.1)


def test_lengths_are_uniform_over_the_range_and_keyed_by_seed_and_first_action():
    turns = [latency.episode_turns(s, "a", 2, 14) for s in range(13_000)]
    counts = np.bincount(turns, minlength=15)[2:]
    assert counts.min() > 0.85 * 1000 and counts.max() < 1.15 * 1000 and min(turns) == 2 and max(turns) == 14
    assert latency.episode_turns(5, "a", 2, 14) == latency.episode_turns(5, "a", 2, 14)
    assert len({latency.episode_turns(5, f"a{k}", 2, 14) for k in range(50)}) > 5  # a group's rollouts differ


def run_episode(env, task, actions):
    env.reset(task)
    results = []
    for a in actions:
        results.append(env.step(a))
        if results[-1].done:
            return results
    raise AssertionError("the episode did not end within the actions given")


def test_an_episode_sleeps_its_draws_and_ends_after_its_turns():
    task = latency.catalogue("train", 3)[2]
    env = latency.LatencyEnv(median_ms=20, p99_ms=60, min_turns=2, max_turns=4)
    actions = [f" eee {k} " for k in range(4)]
    t = time.perf_counter()
    results = run_episode(env, task, actions)
    wall = time.perf_counter() - t
    turns, sleeps = latency.draws(task.seed, [r.action for r in results], median_ms=20, p99_ms=60, min_turns=2,
                                  max_turns=4)
    assert len(results) == turns and 2 <= turns <= 4
    assert [r.info["latency_s"] for r in results] == sleeps
    assert wall >= sum(sleeps)
    assert results[0].action == "eee 0" and not results[0].done and results[-1].done
    assert results[-1].reward == pytest.approx(3 / 3) and results[-1].info["won"]  # "eee": all letters are e
    again = run_episode(env, task, actions)
    assert [r.info["latency_s"] for r in again] == sleeps  # reproducible


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="below the median"):
        latency.LatencyEnv(median_ms=200, p99_ms=100)
    with pytest.raises(ValueError, match="min_turns <= max_turns"):
        latency.LatencyEnv(min_turns=5, max_turns=3)
    with pytest.raises(ValueError, match="no split"):
        latency.catalogue("dev")
    with pytest.raises(RuntimeError, match="before reset"):
        latency.LatencyEnv().step("x")


def test_it_runs_in_the_pool_workers_from_the_registry():
    tasks = registry.catalogue("latency", "test", n=4)
    kwargs = {"latency": {"median_ms": 5, "p99_ms": 20, "min_turns": 1, "max_turns": 3}}
    with EnvPool(2, env_kwargs=kwargs) as pool:
        obs = pool.reset(tasks)
        assert not any(is_failure(o) for o in obs) and obs[0].system_prompt == latency.SYSTEM_PROMPT
        live, taken = set(range(4)), {i: [] for i in range(4)}
        for turn in range(3):
            out = pool.step({i: f"act {i} {turn}" for i in live})
            for i, r in out.items():
                assert not is_failure(r)
                taken[i].append(r.action)
                if r.done:
                    live.discard(i)
        assert not live
    for i, t in enumerate(tasks):
        turns, _ = latency.draws(t.seed, taken[i], median_ms=5, p99_ms=20, min_turns=1, max_turns=3)
        assert len(taken[i]) == turns
