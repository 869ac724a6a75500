"""Choosing a backend: once, from the platform or a sampler's layout; the accelerator backend
runs the model as it is."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxscaffold import backends
from jaxscaffold.backends import accelerator, cpu
from jaxscaffold.models import qwen3
from jaxscaffold.models.config import Qwen3Config
from jaxscaffold.rollout.engine import Sampler, SamplerOptions

CONFIG = Qwen3Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=8)


def test_the_platform_chooses_the_backend():
    assert backends.for_platform("cpu") == cpu.CPU()
    assert backends.for_platform("tpu") == accelerator.Accelerator(platform="tpu")
    assert backends.for_platform("gpu") == accelerator.Accelerator(platform="gpu")
    assert backends.for_platform("tpu").layout == backends.for_platform("gpu").layout == "stacked"
    assert backends.current() is backends.current() == backends.for_platform(jax.default_backend())


def test_a_sampler_layout_chooses_the_backend(monkeypatch):
    monkeypatch.setattr(cpu.os, "cpu_count", lambda: 16)
    assert backends.for_sampler("per_layer") == cpu.CPU(column_blocks=4)  # one block per core, at most 4
    assert backends.for_sampler("per_layer", column_blocks=3) == cpu.CPU(column_blocks=3)
    assert backends.for_sampler("per_layer", mesh=object()).column_blocks == 1  # a sharded sampler
    assert backends.for_sampler("stacked") == accelerator.Accelerator()
    assert backends.for_sampler("auto").layout == backends.current().layout
    with pytest.raises(ValueError, match="unknown sampler layout"):
        backends.for_sampler("rows")


def test_equal_samplers_share_one_program_key():
    a, b = (Sampler(CONFIG, stop_ids=(), batch_size=2, max_len=32,
                    options=SamplerOptions(layout="per_layer", column_blocks=2)) for _ in range(2))
    assert a.programs == b.programs and hash(a.programs) == hash(b.programs)
    assert a.programs != Sampler(CONFIG, stop_ids=(), batch_size=2, max_len=32,
                                 options=SamplerOptions(layout="stacked")).programs


def test_training_kernels_come_from_the_backend():
    assert cpu.CPU().with_kernels(CONFIG).kernels is cpu.KERNELS
    assert accelerator.Accelerator().with_kernels(CONFIG).kernels is None and CONFIG.kernels is None


@pytest.mark.parametrize("platform, dtype, devices, impl", [
    ("gpu", "bfloat16", 8, "cudnn"), ("gpu", "float32", 1, "flash"),  # cuDNN flash attention is bf16 / f16 only
    ("tpu", "float32", 1, "splash"), ("tpu", "bfloat16", 8, "splash"),  # on a mesh under shard_map
    ("portable", "bfloat16", 1, "flash"), ("portable", "float32", 8, "flash")])
def test_the_backend_resolves_auto_attention(platform, dtype, devices, impl):
    assert accelerator.Accelerator(platform=platform).attention_impl(dtype, devices) == impl


def test_auto_attention_is_resolved_by_the_backend_not_the_model():
    """The model reads no platform: "auto" left unresolved runs the portable XLA kernel, and
    a backend's `with_attention` / `with_kernels` hand the model a concrete one (the CPU's
    XLA kernel, fast at short rows; the portable accelerator's O(T)-memory flash kernel)."""
    assert CONFIG.attention_impl == "auto"
    for backend, impl in ((cpu.CPU(), "xla"), (accelerator.Accelerator(), "flash")):
        assert backend.with_attention(CONFIG).attention_impl == impl
        assert backend.with_kernels(CONFIG).attention_impl == impl
    explicit = CONFIG.replace(attention_impl="cudnn")
    assert accelerator.Accelerator(platform="tpu").with_attention(explicit) is explicit  # a chosen kernel stays
    params = qwen3.init_params(CONFIG, jax.random.key(1))
    tokens = jnp.arange(12, dtype=jnp.int32).reshape(2, 6) % CONFIG.vocab_size
    np.testing.assert_array_equal(qwen3.forward(params, CONFIG, tokens),
                                  qwen3.forward(params, CONFIG.replace(attention_impl="xla"), tokens))


def test_only_backends_and_the_compiler_read_the_platform():
    import pathlib
    root = pathlib.Path(backends.__file__).parents[1]
    readers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                     if "default_backend()" in p.read_text() or "cpu_count()" in p.read_text())
    assert readers == ["backends/__init__.py", "backends/cpu.py", "compiler.py"], readers


def test_the_accelerator_cache_holds_bf16_as_bf16():
    """On TPU / GPU the bf16 cache is bf16 (the bits-as-uint16 form is XLA:CPU's alone)."""
    state = Sampler(CONFIG, stop_ids=(), batch_size=2, max_len=32,
                    options=SamplerOptions(layout="stacked", cache_dtype="bfloat16")).init_state()
    assert state.cache.k.dtype == state.cache.v.dtype == jnp.bfloat16 and state.cache.k.ndim == 5
    state = Sampler(CONFIG, stop_ids=(), batch_size=2, max_len=32,
                    options=SamplerOptions(layout="per_layer", cache_dtype="bfloat16")).init_state()
    assert len(state.cache.k) == CONFIG.num_layers and state.cache.k[0].dtype == jnp.uint16


@pytest.mark.parametrize("backend", [accelerator.Accelerator(), cpu.CPU(column_blocks=2)], ids=lambda b: b.name)
def test_backend_decode_steps_equal_the_full_forward(backend):
    """Each backend's own prefill and single-token steps (its layout, its cache) give the
    model's full-forward logits of the whole sequence."""
    params = qwen3.init_params(CONFIG, jax.random.key(0))
    params = jax.tree.map(lambda x: x * 10 if x.ndim > 1 else x, params)

    @jax.jit
    def step(p, tokens, segments, cache):
        h, cache = backend.hidden_states(backend.prepare(p, CONFIG), CONFIG, tokens, segment_ids_BT=segments,
                                         cache=cache, window=16)
        return backend.unembed(backend.prepare(p, CONFIG), CONFIG, h), cache

    rng = np.random.RandomState(5)
    lengths, total, steps = [6, 2, 4], 6, 4
    full = rng.randint(0, CONFIG.vocab_size, (3, total + steps)).astype(np.int32)
    prompt, mask = np.zeros((3, total), np.int32), np.zeros((3, total), np.int32)
    for b, n in enumerate(lengths):
        prompt[b, :n], mask[b, :n] = full[b, :n], 1
    cache = backend.empty_cache(CONFIG, 3, 16, "float32")
    logits, cache = step(params, jnp.asarray(prompt), jnp.asarray(mask), cache)
    ref = np.asarray(qwen3.forward(params, CONFIG, jnp.asarray(full)))
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(np.asarray(logits)[b, :n], ref[b, :n], atol=1e-4)
    for s in range(steps):
        nxt = np.stack([full[b, n + s] for b, n in enumerate(lengths)])[:, None]
        logits, cache = step(params, jnp.asarray(nxt), jnp.ones((3, 1), jnp.int32), cache)
        for b, n in enumerate(lengths):
            want = np.asarray(qwen3.forward(params, CONFIG, jnp.asarray(full[b:b + 1, :n + s + 1])))[0, -1]
            np.testing.assert_allclose(np.asarray(logits)[b, 0], want, atol=1e-4)
