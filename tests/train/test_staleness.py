"""Training that overlaps rollouts (`rollout.max_staleness`): k = 0 is the synchronous loop
exactly; k = 1 collects each step with the policy the schedule names, records every token's
version, logs the staleness histogram, checkpoints no future step and resumes from its step."""

import jax
import numpy as np
import pytest

from jaxscaffold.envs.base import Task
from jaxscaffold.episodes.episode import Episode
from jaxscaffold.rollout.conversation import Conversation
from jaxscaffold.train.checkpoint import Checkpointer
from jaxscaffold.train.collector import staleness_filter
from jaxscaffold.train.job import build_job
from jaxscaffold.train.trainer import train
from jaxscaffold.train.update import train_on
from jaxscaffold.train.workloads.env_rl import EnvWorkload
from tests.train.configs import tiny_config

ROWS = 8  # tiny_config: 2 tasks x 4 rollouts, one trajectory row each
# The runs here are on the word vocabulary (tiny_config's `words`): what they check (versions,
# schedules, checkpoints, bit-equal loops) does not depend on Qwen3's.


def leaves(params):
    return [np.asarray(x) for x in jax.tree.leaves(params)]


def synchronous_reference(cfg, steps):
    """Today's loop written out from the parts: collect with the current policy, then train.
    Returns the per-step metrics, the parameters before each step and the workload's states."""
    job, state = build_job(cfg)
    work = EnvWorkload(job, state.params)
    history, params, states = [], [], []
    try:
        for step in range(1, steps + 1):
            params.append(leaves(state.params))
            episodes, stats = work.collect(job, state.params, step)
            states.append(work.get_state())
            state, metrics = train_on(job, state, episodes)
            history.append({**stats, **metrics})
    finally:
        work.close()
    return history, params, states


@pytest.mark.slow  # ~50 s on a loaded 2-core machine: two 2-step runs
def test_staleness_0_is_the_synchronous_loop_bit_for_bit(tmp_path):
    cfg = tiny_config(tmp_path / "run", steps=2, words=True, **{"eval.every": 0, "checkpoint.every": 2})
    out = train(cfg)
    reference, _, _ = synchronous_reference(tiny_config(tmp_path / "ref", steps=2, words=True), 2)
    for h, r in zip(out["history"], reference, strict=True):
        assert not any(k.startswith("rollout/staleness") for k in h)  # k = 0 logs what it logged
        for k, v in r.items():
            if not k.startswith("time/"):  # wall-clock seconds (the rollouts' decode / env / idle shares)
                assert h[k] == v, k


@pytest.mark.slow  # ~80 s: a 3-step run, its resume and a 2-step reference
def test_staleness_1_collects_ahead_with_the_scheduled_versions(tmp_path):
    seen = {}

    class Recording(EnvWorkload):
        def collect(self, job, params, step):
            seen[step] = leaves(params)
            episodes, stats = super().collect(job, params, step)
            assert all(not e.conversation.versions for e in episodes)  # the collector records them
            return episodes, stats

    # The trainer's old log-probs, TIS and MIS: the correction a stale batch trains with.
    correction = {"rl.recompute_old_logprobs": True, "rl.tis_cap": 2.0, "rl.mis": "token"}
    async_run = {"eval.every": 2, "checkpoint.every": 1, "rollout.max_staleness": 1, **correction}
    out = train(tiny_config(tmp_path / "run", steps=3, words=True, **async_run), workload=Recording)
    _, ref_params, ref_states = synchronous_reference(tiny_config(tmp_path / "ref", steps=2, words=True, **correction), 2)
    # Step t samples with version max(0, t - 2): steps 1 and 2 the initial policy, step 3 the
    # policy after step 1 (equal to the synchronous run's: step 1's rollouts are the same).
    for t, version in ((1, 0), (2, 0), (3, 1)):
        for a, b in zip(seen[t], ref_params[version], strict=True):
            np.testing.assert_array_equal(a, b)
    h = out["history"]
    assert [(x["rollout/staleness_0"], x["rollout/staleness_1"]) for x in h] == [(ROWS, 0), (0, ROWS), (0, ROWS)]
    assert all(x["rollout/stale_dropped_rows"] == 0 and np.isfinite(x["train/loss"]) for x in h)
    assert "eval/success" in h[1] and all(x["time/collect_s"] > 0 for x in h)
    # MIS tests pi_old / pi_sampler: on-policy only the numerics differ (nothing masked); one
    # version behind, the ratio moves away from 1.
    assert h[0]["train/mis_masked"] == 0 and abs(np.log(h[0]["train/is_ratio_max"])) < 1e-3
    assert all(max(-np.log(x["train/is_ratio_min"]), np.log(x["train/is_ratio_max"])) > 1e-3 for x in h[1:])
    assert all(0 <= x["train/mis_masked"] <= 1 for x in h)
    # Each checkpoint holds the workload's state after its own step's collect, not a later one.
    ckpt = Checkpointer(str(tmp_path / "run" / "checkpoints"), keep=None)
    try:
        for step in (1, 2):
            assert ckpt.restore_extra(step)["workload"] == ref_states[step - 1]
    finally:
        ckpt.close()
    # Resumed from step 3's checkpoint with one more step: collection restarts at step 4 with
    # the checkpoint's policy, on-policy.
    seen.clear()
    more = train(tiny_config(tmp_path / "run", steps=4, words=True, **async_run), workload=Recording)
    assert list(seen) == [4]
    assert more["history"][-1]["rollout/staleness_0"] == ROWS


def _episode(group, versions_per_turn):
    """An episode whose model turns were sampled by the given versions (one token per turn)."""
    conv = Conversation()
    for v in versions_per_turn:
        conv.add_context([1, 2])
        conv.ids.append(3)
        conv.assistant_mask.append(1)
        conv.logprobs.append(-0.5)
        conv.record_version(v)
    return Episode(task=Task(env="letters", task_id="t", split="train"), group=group, conversation=conv)


def test_versions_are_per_token_and_stale_rows_are_dropped_and_counted():
    fresh, partial, stale = _episode(0, [5, 5]), _episode(0, [3, 4]), _episode(1, [2, 2])
    assert partial.conversation.versions == [-1, -1, 3, -1, -1, 4]
    assert list(partial.conversation.arrays()["versions"]) == [-1, -1, 3, -1, -1, 4]
    kept, stats = staleness_filter([fresh, partial, stale], version=5, max_staleness=2)
    assert kept == [fresh, partial]  # a row's age is its oldest token's: 5 - 3 = 2
    assert stats == {"rollout/staleness_0": 1.0, "rollout/staleness_1": 0.0, "rollout/staleness_2": 1.0,
                     "rollout/staleness_3": 1.0, "rollout/stale_dropped_rows": 1.0}


def test_configs_say_what_they_run():
    """The papers' configs stay on-policy; fee_async validates with staleness 1 and MIS."""
    import glob
    import os

    from jaxscaffold import config as config_lib
    from tests.train.configs import ROOT, load_config

    for path in glob.glob(os.path.join(ROOT, "configs", "*.py")):
        name = os.path.basename(path)[:-3]
        if name.startswith(("fee", "standard", "rwml")) and name != "fee_async":
            cfg = load_config(name)
            assert cfg.rollout.get("max_staleness", 0) == 0 and cfg.rl.get("mis", "off") == "off", name
    c = config_lib.typed(load_config("fee_async"))
    assert c.rollout.max_staleness == 1 and c.rl.mis == "token" and c.rl.recompute_old_logprobs
    assert c.envs.train == "sciworld"


@pytest.mark.slow  # ~40 s: a 2-step run
def test_a_split_pod_samples_on_its_rollout_devices(tmp_path):
    """mesh.rollout_devices = 1 of 2: the update on the first device, rollouts on the second,
    with the weights moved there device to device."""
    devices = jax.devices()[:2]
    placed = {}

    class Recording(EnvWorkload):
        def collect(self, job, params, step):
            placed[step] = set().union(*(x.sharding.device_set for x in jax.tree.leaves(params)))
            assert set(job.mesh.devices.flat) == {devices[0]} and set(job.sampler.mesh.devices.flat) == {devices[1]}
            return super().collect(job, params, step)

    cfg = tiny_config(tmp_path, steps=3, words=True, **{"eval.every": 3, "checkpoint.every": 3, "mesh.devices": 2,
                                            "mesh.rollout_devices": 1, "rollout.max_staleness": 1})
    out = train(cfg, workload=Recording)
    assert placed == {1: {devices[1]}, 2: {devices[1]}, 3: {devices[1]}}
    assert set().union(*(x.sharding.device_set for x in jax.tree.leaves(out["state"].params))) == {devices[0]}
    assert all(np.isfinite(h["train/loss"]) for h in out["history"]) and "eval/success" in out["history"][-1]


def test_a_split_needs_devices_left_to_train(tmp_path):
    with pytest.raises(ValueError, match="rollout_devices=2"):
        build_job(tiny_config(tmp_path, **{"mesh.devices": 2, "mesh.rollout_devices": 2}))


def test_the_memory_plan_knows_the_split_and_the_published_copies():
    """A split pod plans each part on its own devices; staleness on shared devices overlaps
    the phases and holds k + 1 copies of the policy."""
    from jaxscaffold import config as config_lib
    from jaxscaffold.train import memory_plan

    def plan(**overrides):
        cfg = config_lib.typed(tiny_config("unused", **{"mesh.devices": 0, "mesh.data": 1, "mesh.fsdp": -1,
                                                        **overrides}))
        return memory_plan.plan(cfg, hbm_bytes=16e9, devices=jax.devices()[:8], compile_step=False)

    shared, overlapped = plan(), plan(**{"rollout.max_staleness": 1})
    split = plan(**{"rollout.max_staleness": 1, "mesh.rollout_devices": 4})
    assert shared.published == 0 and shared.peak == max(shared.train_peak, shared.rollout_peak)
    update = overlapped.state + overlapped.grads
    assert overlapped.published == 2 * overlapped.params  # f32 master weights, fsdp over 8: the policy's shards
    assert overlapped.train_peak == update + overlapped.sampler_weights + overlapped.kv_cache + overlapped.published
    assert split.params > shared.params  # fsdp over the 4 training devices only
    assert split.train_peak == split.state + split.grads
    assert split.published == split.sampler_weights  # k = 1 more copy, on the rollout devices
    assert split.rollout_peak == 2 * split.sampler_weights + split.kv_cache
