"""The stacked (TPU / GPU) layout attends over a window of the cache, as the CPU layout does:
the same tokens as attending over the whole capacity (logprobs to f32 rounding), with the programs that do
it reading only the window."""

import re

import jax
import numpy as np
import pytest

from jaxscaffold.models import config as model_configs
from jaxscaffold.models import qwen3
from jaxscaffold.rollout import engine
from jaxscaffold.rollout.engine import Sampler, SamplerOptions
from jaxscaffold.rollout.sampling import SamplingConfig

CAPACITY = 300  # windows 128, 192, 256, 300
STOP = (511,)  # the last id of the small vocabulary


def _sharp(config):
    params = qwen3.init_params(config, jax.random.key(3))
    return config, jax.tree.map(lambda x: x * 8 if x.ndim > 1 else x, params)  # sharper than uniform


@pytest.fixture(scope="module")
def tiny():
    return _sharp(model_configs.tiny(vocab_size=512))  # token ids only: a small vocabulary keeps the LM head cheap


@pytest.fixture(scope="module")
def tiny_qwen():
    """Qwen3's vocabulary: the sharded test's 1e-5 on log-probs holds there; on 512 ids a
    log-prob's last bits moved by 1.1e-5 (tokens equal)."""
    return _sharp(model_configs.tiny())


def _two_turns(sampler, params):
    """Rows of 100 and 3 prompt tokens decode 40 tokens (slot 0 crosses windows 128 -> 192),
    take 60 more prompt tokens (a windowed prefill), decode 40 more (slot 0: 200 -> 240, then
    past 256)."""
    rng = np.random.RandomState(7)
    vocab = sampler.config.vocab_size
    state = sampler.extend(params, sampler.init_state(), {0: list(rng.randint(0, vocab, 100)),
                                                           1: list(rng.randint(0, vocab, 3))})
    state, first = sampler.generate(params, state, [0, 1], max_new_tokens=40, seeds=[11, 12])
    state = sampler.extend(params, state, {0: list(rng.randint(0, vocab, 60))})
    state, second = sampler.generate(params, state, [0, 1], max_new_tokens=60, seeds=[13, 14])
    return [first, second]


def test_stacked_windows_give_the_full_capacity_tokens(tiny, monkeypatch):
    config, params = tiny
    windows = []
    decode = engine._decode
    monkeypatch.setattr(engine, "_decode", lambda *a, **kw: windows.append(kw["window"]) or decode(*a, **kw))
    outs = {}
    for name, buckets in (("windowed", None), ("full", (CAPACITY,))):
        windows.clear()
        # Greedy: a sampled token at temperature 1 (seen over Qwen's 151,936 ids) flips on the
        # last bits of its logits (the window sums in another order), which differ by
        # instruction set (seen on an Intel Xeon, not on a Zen); the argmax does not.
        sampler = Sampler(config, batch_size=2, max_len=CAPACITY, stop_ids=(),
                          options=SamplerOptions(sampling=SamplingConfig(temperature=0.0), layout="stacked",
                                                 window_buckets=buckets))  # the bf16 cache of TPU / GPU
        outs[name] = (_two_turns(sampler, params), list(windows))
    assert outs["windowed"][1] == [128, 192, 256, 300] and outs["full"][1] == [CAPACITY] * 2
    for turn_w, turn_f in zip(outs["windowed"][0], outs["full"][0]):
        for slot in (0, 1):
            np.testing.assert_array_equal(turn_w[slot].tokens, turn_f[slot].tokens)
            # The softmax sums over the window instead of the capacity (the slots between hold
            # exact zeros), in another order: the last bits may differ, by up to 1.8e-4 of a
            # log-probability near -7 (2.5e-5 relative) on an AMD EPYC; a slot read wrongly moves
            # them by far more (and the tokens above).
            np.testing.assert_allclose(turn_w[slot].logprobs, turn_f[slot].logprobs, rtol=1e-4, atol=1e-5)
    assert [len(turn[0].tokens) for turn in outs["windowed"][0]] == [40, 60]


def test_a_windowed_decode_reads_only_its_window(tiny):
    """The lowered decode of a 128-slot window reads 128 slots of the cache per layer (its
    dynamic slices), the full-capacity one every slot."""
    config, _ = tiny
    for buckets, slots in ((None, 128), ((CAPACITY,), CAPACITY)):
        sampler = Sampler(config, stop_ids=STOP, batch_size=2, max_len=CAPACITY,
                          options=SamplerOptions(layout="stacked", window_buckets=buckets))
        lowered = sampler.lower_decode(qwen3.param_shapes(config), jax.eval_shape(sampler.init_state),
                                       window=sampler.decode_window(100))
        text = lowered.as_text(dialect="hlo")
        layer_reads = {int(n) for n in re.findall(
            rf"bf16\[1,2,{config.num_kv_heads},(\d+),{config.head_dim}\]\{{4,3,2,1,0\}} dynamic-slice\(", text)}
        assert layer_reads == {slots}, layer_reads  # a layer's keys / values: the window's slots only


def test_window_buckets_must_end_at_the_capacity(tiny):
    config, _ = tiny
    assert Sampler(config, stop_ids=STOP, batch_size=1, max_len=700).prefill_window_buckets == (128, 256, 512, 700)
    assert Sampler(config, stop_ids=STOP, batch_size=1, max_len=700,
                   options=SamplerOptions(window_buckets=(192, 700))).prefill_window_buckets == (700,)
    for bad in ((128, 256), (256, 128, 700)):
        with pytest.raises(ValueError, match="window_buckets"):
            Sampler(config, stop_ids=STOP, batch_size=1, max_len=700, options=SamplerOptions(window_buckets=bad))


def test_sharded_windows_equal_unsharded(tiny_qwen):
    """Rows over the batch axes, kv heads over `tensor`: the windowed stacked decode gives the
    unsharded one's tokens, and the cache keeps its sharding."""
    from jaxscaffold.models.sharding import MeshConfig, make_mesh
    config, params = tiny_qwen
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    outs = []
    for p, m in ((params, None), (jax.device_put(params, qwen3.param_shardings(config, mesh)), mesh)):
        sampler = Sampler(config, batch_size=4, max_len=CAPACITY, stop_ids=(), mesh=m,
                          options=SamplerOptions(sampling=SamplingConfig(temperature=1.0), layout="stacked"))
        state = sampler.extend(p, sampler.init_state(), {s: [s + 10, 2 * s + 11] * 60 for s in range(4)})
        state, out = sampler.generate(p, state, list(range(4)), max_new_tokens=12, seeds=[1, 2, 3, 4])
        if m is not None:
            want = jax.sharding.NamedSharding(m, jax.sharding.PartitionSpec(None, ("data", "fsdp"), "tensor"))
            assert state.cache.k.sharding.is_equivalent_to(want, 5), state.cache.k.sharding
        outs.append(out)
    for s in range(4):  # 120 prompt tokens + 12: windows 128, then 192
        np.testing.assert_array_equal(outs[0][s].tokens, outs[1][s].tokens)
        np.testing.assert_allclose(outs[0][s].logprobs, outs[1][s].logprobs, atol=1e-5)
