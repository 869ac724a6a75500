"""Partial rollouts (`rollout.partial`): episodes that continue under newer weights.

At the agent: a swap at a fixed decode chunk (a deterministic `refresh_params`) changes no
token before it, records each token's version, and the recorded log-probabilities are those
of the distribution that sampled each token (checked against teacher-forced log-probs of the
old and new weights). At the collector: a version the trainer publishes mid-collect reaches
the running step, and the step logs the per-token staleness."""

import threading
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxscaffold import config as config_lib
from jaxscaffold.envs import registry
from jaxscaffold.envs.base import Task
from jaxscaffold.envs.local import LocalEnvs
from jaxscaffold.episodes.agents import ModelAgent, RolloutConfig
from jaxscaffold.episodes.driver import run_episodes
from jaxscaffold.episodes.episode import Episode
from jaxscaffold.models import qwen3
from jaxscaffold.rl.logprobs import token_logprobs
from jaxscaffold.rollout.conversation import Conversation
from jaxscaffold.rollout.engine import Sampler, SamplerOptions
from jaxscaffold.rollout.sampling import SamplingConfig
from jaxscaffold.train.collector import AheadCollector, staleness_filter, version_stats
from jaxscaffold.train.trainer import train
from jaxscaffold.train.workloads.env_rl import EnvWorkload
from tests.train.configs import tiny_config, word_model

# The tiny model on the rooms env's own word vocabulary (~270 ids, not Qwen3's 151,936): what a
# swap does to tokens, versions and log-probs does not depend on the vocabulary.
TOKENIZER, CONFIG = word_model()
TASKS = [t for t in registry.catalogue("rooms", "train")[:2] for _ in range(2)]


class SwapAt:
    """`refresh_params` that answers (old, 0) to its first `asks` calls, then (new, 1): a swap
    at a fixed decode chunk (the agent asks once when built and once before each chunk)."""

    def __init__(self, old, new, asks):
        self.old, self.new, self.asks, self.calls = old, new, asks, 0

    def __call__(self):
        self.calls += 1
        return (self.old, 0) if self.calls <= self.asks else (self.new, 1)


def _run(params, refresh=None, reprefill=False):
    sampler = Sampler(CONFIG, stop_ids=TOKENIZER.eos_ids, batch_size=4, max_len=512,
                      options=SamplerOptions(cache_dtype="float32", sampling=SamplingConfig(temperature=1.0)))
    agent = ModelAgent(params, sampler, TOKENIZER, RolloutConfig(max_new_tokens=12), seed=5, train_step=2,
                       refresh_params=refresh, reprefill=reprefill)
    episodes = run_episodes(agent, LocalEnvs({"rooms": registry.factory("rooms")}), TASKS, max_turns=2,
                            decode_chunk=4)
    return agent, [e.conversation for e in episodes]


def _teacher_forced(params, conv):
    logp, _ = token_logprobs(params, CONFIG, jnp.asarray([conv.ids], jnp.int32))
    return np.asarray(logp[0])


@pytest.fixture(scope="module")
def versions():
    old = qwen3.init_params(CONFIG, jax.random.key(0))
    new = qwen3.init_params(CONFIG, jax.random.key(1))  # far from old: the kept cache shows
    return old, new


@pytest.mark.slow  # ~30 s: four driver runs of the tiny model
def test_a_swap_mid_episode_keeps_earlier_tokens_and_records_each_tokens_version(versions):
    old, new = versions
    _, plain = _run(old)
    agent, same = _run(old, SwapAt(old, new, asks=10**6))  # refresh that never swaps: the same tokens
    assert agent.swaps == 0 and [c.ids for c in same] == [c.ids for c in plain]
    assert all(set(c.sampled_versions()) == {0} for c in same)

    for reprefill in (False, True):
        agent, convs = _run(old, SwapAt(old, new, asks=3), reprefill=reprefill)  # built + 2 chunks on old
        assert agent.swaps == 1
        mixed = 0
        for conv, ref in zip(convs, plain, strict=True):
            v = conv.arrays()["versions"]  # (-1 past the last record: context after the last chunk)
            mask = np.asarray(conv.assistant_mask)
            assert np.all(v[mask == 0] == -1) and set(v[mask == 1]) <= {0, 1}
            sampled = v[mask == 1]
            assert np.all(np.diff(sampled) >= 0)  # the versions only move forward
            mixed += len(set(sampled)) == 2
            first_new = int(np.argmax(v == 1)) if (v == 1).any() else len(v)
            assert conv.ids[:first_new] == ref.ids[:first_new]  # before the swap: the non-partial tokens
            # The recorded (old) log-probs are those of the sampling version, per token.
            lp = np.asarray(conv.logprobs)
            np.testing.assert_allclose(lp[v == 0], _teacher_forced(old, conv)[v == 0], atol=2e-3)
            err = np.abs(lp[v == 1] - _teacher_forced(new, conv)[v == 1])
            if reprefill:  # the cache recomputed: exactly the new weights' distribution
                np.testing.assert_allclose(err, 0.0, atol=2e-3)
            elif err.size:  # the cache of the earlier tokens kept: a different distribution
                assert err.max() > 0.1
        assert mixed >= 2  # the swap came mid-episode for several rows


def test_staleness_counts_a_mixed_row_by_its_oldest_token():
    conv = Conversation()
    for version in (3, 4, 4):
        conv.add_context([1, 2])
        conv.ids.append(7)
        conv.assistant_mask.append(1)
        conv.logprobs.append(-0.5)
        conv.record_version(version)
    episode = Episode(task=Task(env="letters", task_id="t", split="train"), group=0, conversation=conv)
    kept, stats = staleness_filter([episode], version=5, max_staleness=1)
    assert kept == [] and stats["rollout/staleness_2"] == 1 and stats["rollout/stale_dropped_rows"] == 1
    assert version_stats([episode], 5, 1) == {"rollout/token_staleness_0": 0.0, "rollout/token_staleness_1": 2.0,
                                              "rollout/token_staleness_2": 1.0, "rollout/mixed_version_rows": 1.0}


class WaitingWork:
    """A workload whose step 2 waits (up to 60 s) for a newer version to arrive through
    `refresh_params`, then returns one row with a token of every version it decoded with."""

    partial_rollouts = True

    def __init__(self):
        self.seen: dict[int, list[int]] = {}
        self.arrived = threading.Event()

    def collect(self, job, params, step, refresh_params):
        seen = [refresh_params()[1]]
        deadline = time.monotonic() + 60
        while step == 2 and seen[-1] == seen[0] and time.monotonic() < deadline:
            time.sleep(0.01)
            seen.append(refresh_params()[1])
        self.seen[step] = seen
        conv = Conversation()
        for v in dict.fromkeys(seen):
            conv.add_context([1])
            conv.ids.append(2)
            conv.assistant_mask.append(1)
            conv.logprobs.append(-1.0)
            conv.record_version(v)
        return [Episode(Task("letters", "t", "train"), 0, conv)], {}

    def get_state(self):
        return {}


def _job(partial=True):
    rollout = types.SimpleNamespace(partial=partial)
    cfg = types.SimpleNamespace(rollout=rollout, mesh=types.SimpleNamespace(rollout_devices=0))
    return types.SimpleNamespace(cfg=cfg, sampler=types.SimpleNamespace(mesh=None))


def test_the_collector_hands_a_version_published_mid_collect_to_the_running_step():
    work = WaitingWork()
    params = lambda v: {"w": jnp.full((2,), float(v))}
    collector = AheadCollector(work, _job(), params(0), version=0, first_step=1, last_step=3, max_staleness=1)
    try:
        episodes, stats, version, _ = collector.next(1)
        assert version == 0 and work.seen[1] == [0]
        collector.publish(params(1), 1)  # step 2 (scheduled with version 0) is running: it continues under 1
        episodes, stats, version, _ = collector.next(2)
        assert version == 0 and work.seen[2][0] == 0 and work.seen[2][-1] == 1
        assert episodes[0].conversation.sampled_versions() == [0, 1]
        assert stats == {"rollout/token_staleness_0": 1.0, "rollout/token_staleness_1": 1.0,
                         "rollout/mixed_version_rows": 1.0}
        collector.publish(params(2), 2)  # the last version any step could use
        episodes, stats, version, _ = collector.next(3)
        assert version == 1 and work.seen[3][0] in (1, 2)
    finally:
        collector.close()


def test_partial_needs_staleness_the_async_driver_and_a_chunked_workload(tmp_path):
    with pytest.raises(config_lib.ConfigError, match="rollout.partial needs rollout.max_staleness"):
        config_lib.typed(tiny_config(tmp_path, **{"rollout.partial": True}))
    with pytest.raises(config_lib.ConfigError, match="asynchronous driver"):
        config_lib.typed(tiny_config(tmp_path, **{"rollout.partial": True, "rollout.max_staleness": 1,
                                                  "rollout.lockstep": True}))
    config_lib.typed(tiny_config(tmp_path, **{"rollout.partial": True, "rollout.max_staleness": 1}))

    class Unchunked:
        def collect(self, job, params, step):
            return [], {}

    with pytest.raises(ValueError, match="rollout.partial: the Unchunked workload"):
        AheadCollector(Unchunked(), _job(), {}, version=0, first_step=1, last_step=2, max_staleness=1)


class SwapsInStep2(EnvWorkload):
    """The env workload whose step 2 (sampled by version 0 while step 1 trains) waits, at its
    agent's third ask (built, then before two chunks), for the trainer's version 1: the swap
    lands mid-collect, at a fixed point, instead of wherever timing puts it."""

    def collect(self, job, params, step, refresh_params=None):
        if step == 2 and refresh_params is not None:
            asks, inner = [0], refresh_params

            def refresh_params():
                asks[0] += 1
                out, deadline = inner(), time.monotonic() + 300
                while asks[0] >= 3 and out[1] == 0 and time.monotonic() < deadline:
                    time.sleep(0.05)
                    out = inner()
                return out

        return super().collect(job, params, step, refresh_params=refresh_params)


@pytest.mark.slow  # ~100 s: a 3-step run
def test_a_partial_run_trains_rows_of_mixed_versions_within_the_bound(tmp_path):
    """fee_async's settings (staleness 1, the trainer's old log-probs, token MIS) with partial
    rollouts, 3 steps, step 2's swap placed mid-collect: its rows mix versions 0 and 1, count as
    one version old (their oldest token) and train; every token is counted once."""
    run = {"eval.every": 0, "checkpoint.every": 3, "rollout.max_staleness": 1, "rollout.partial": True,
           "rl.recompute_old_logprobs": True, "rl.mis": "token", "rollout.decode_chunk": 4}
    h = train(tiny_config(tmp_path, steps=3, words=True, **run), workload=SwapsInStep2)["history"]
    rows = 8  # tiny_config: 2 tasks x 4 rollouts
    for x in h:
        assert np.isfinite(x["train/loss"]) and x["rollout/stale_dropped_rows"] == 0
        assert x["rollout/staleness_0"] + x["rollout/staleness_1"] == rows
        assert not any(k.startswith("rollout/token_staleness_") and k[-1] not in "01" for k in x)
        assert 0 <= x["rollout/mixed_version_rows"] <= x["rollout/staleness_1"]  # a mixed row is as old as its oldest
        assert "train/is_ratio_max" in x and 0 <= x["train/mis_masked"] <= 1
    assert h[0]["rollout/token_staleness_1"] == 0 and h[0]["rollout/mixed_version_rows"] == 0  # nothing older yet
    step2 = h[1]
    assert step2["rollout/mixed_version_rows"] > 0  # the swap came mid-episode
    assert step2["rollout/token_staleness_0"] > 0 and step2["rollout/token_staleness_1"] > 0
    assert step2["rollout/staleness_1"] == rows  # every row holds tokens of version 0
