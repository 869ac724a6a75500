"""`Sampler.compile_programs`: after it, calls that group the same rows differently (as an
asynchronous rollout does when envs answer at other times) compile nothing, counted by JAX's own
compile events; a sampler warmed only by running the first grouping does compile for the second."""

import jax
import jax.monitoring
import numpy as np
import pytest

from jaxscaffold.models import config as model_config, qwen3
from jaxscaffold.rollout.engine import Sampler, SamplerOptions
from jaxscaffold.rollout.sampling import SamplingConfig

CONFIG = model_config.tiny(vocab_size=256)
PROMPTS = {slot: list(range(2, 2 + n)) for slot, n in enumerate([40, 21, 50, 33, 60, 27, 45, 38])}
OBSERVATIONS = {slot: [5 + slot] * (3 + 2 * slot) for slot in range(8)}  # 3..17 tokens: widths 16 and 32


class Compiles:
    """Backend compiles while the block runs (XLA programs, eager ops included)."""

    def __call__(self, event, duration_s, **_):
        if event.endswith("backend_compile_duration"):
            self.count += 1

    def __enter__(self):
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self)


def _sampler(temperature):
    return Sampler(CONFIG, stop_ids=(), batch_size=8, max_len=128,
                   options=SamplerOptions(layout="per_layer", sampling=SamplingConfig(temperature=temperature),
                                          cache_dtype="float32", row_buckets=(4, 8)))


def _all_together(sampler, params):
    """Lock step: every slot in each call."""
    state = sampler.extend(params, sampler.init_state(), PROMPTS)
    state, _ = sampler.generate(params, state, list(PROMPTS), max_new_tokens=8, seeds=list(PROMPTS))
    state = sampler.extend(params, state, OBSERVATIONS)
    return sampler.release(state, [3])


def _scattered(sampler, params):
    """The same rows grouped as they might come back from envs: alone, in twos and threes."""
    state = sampler.init_state()
    for group in ([4], [0, 7], [1, 2, 3], [5, 6]):
        state = sampler.extend(params, state, {s: PROMPTS[s] for s in group})
        state, _ = sampler.generate(params, state, group, max_new_tokens=8, seeds=group)
    for group in ([6], [0, 5], [1, 2, 3, 4], [7]):
        state = sampler.extend(params, state, {s: OBSERVATIONS[s] for s in group})
    return sampler.release(state, [1])


def _placed(params, placement):
    """Parameters committed as rollouts get them: on a one-device mesh (a training job's state),
    or on one device (`multihost.sampler_params` for a mesh-less sampler: one replica's arrays).
    Either way a call's output state is committed there and a fresh one is not, and a
    program's key includes its arguments' placement."""
    if placement == "mesh":
        mesh = jax.sharding.Mesh(jax.devices()[:1], ("data",))
        return jax.device_put(params, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    return jax.device_put(params, jax.devices()[0])


@pytest.mark.slow  # compiles the sampler's programs for three prefill row buckets, twice
@pytest.mark.parametrize("placement", ["mesh", "device"])
def test_a_warmed_sampler_compiles_nothing_for_other_groupings_of_the_rows_it_met(placement):
    # "device" is the rollout benchmark's case that compiled for 22-24 s in the timed
    # asynchronous run: the programs compiled ahead took a fresh (uncommitted) state, the calls
    # after the first a committed one
    params = _placed(qwen3.init_params(CONFIG, jax.random.key(0)), placement)
    control, warmed = _sampler(0.5), _sampler(1.0)  # other sampling: programs of their own
    for sampler in (control, warmed):
        p = sampler.prepare(params)
        jax.block_until_ready(_all_together(sampler, p))
    p = warmed.prepare(params)
    assert warmed.shapes_met == {"width": {16, 32, 64}, "prefill_window": {128}, "decode_window": {128},
                                 "decode_steps": {16}}
    with Compiles() as compiling:
        n = warmed.compile_programs(p, warmed.init_state(), shapes=warmed.shapes_met)
    # decode: 2 row buckets; prefill: widths 16 (rows 4, 8: at least 64 tokens), 32 and 64 (rows
    # 2, 4, 8); gathers: take and put for rows 2 and 4; once, for the state placed as a call
    # leaves it (a fresh state is placed so before its first call)
    assert n == 2 + (2 + 3 + 3) + 4
    assert 0 < compiling.count  # what the lock-step calls did not meet
    with Compiles() as compiling:
        assert warmed.compile_programs(p, warmed.init_state(), shapes=warmed.shapes_met) == n
    assert compiling.count == 0
    with Compiles() as compiling:
        jax.block_until_ready(_scattered(warmed, p))
    assert compiling.count == 0
    with Compiles() as compiling:  # the control, warmed by running only: it compiles here
        jax.block_until_ready(_scattered(control, control.prepare(params)))
    assert compiling.count > 0
    # without `shapes`: every width bucket (16, 32, 64 and 128) over every window (128), decode
    # steps up to 8 (one bucket: 16)
    assert warmed.compile_programs(p, warmed.init_state(), max_decode=8) == 2 + (2 + 3 * 3) + 4

