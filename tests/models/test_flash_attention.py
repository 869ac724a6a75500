"""The pure-JAX flash kernel against the reference `xla_attention`, and its memory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxscaffold.models import attention, qwen3
from jaxscaffold.models.config import tiny
from jaxscaffold.models.flash_attention import flash_attention


def _inputs(t, heads=4, kv_heads=2, dim=16, seed=0):
    rng = np.random.RandomState(seed)
    q = jnp.asarray(rng.randn(3, t, heads, dim), jnp.float32)
    k = jnp.asarray(rng.randn(3, t, kv_heads, dim), jnp.float32)
    v = jnp.asarray(rng.randn(3, t, kv_heads, dim), jnp.float32)
    seg = np.ones((3, t), np.int32)
    seg[0, t * 2 // 3:] = 0  # right padding
    seg[1, : t // 3], seg[1, t // 3:] = 1, 2  # two packed segments, the second spanning tiles
    seg[2, : t // 5] = 0  # left padding
    return q, k, v, jnp.asarray(seg)


def _reference(q, k, v, seg):
    idx = jnp.arange(q.shape[1])
    return attention.xla_attention(q, k, v, attention.attention_mask(seg, seg, jnp.broadcast_to(idx, seg.shape), idx))


@pytest.mark.parametrize("t, block", [(100, 32), (64, 16), (24, 512)], ids=["ragged-tiles", "even-tiles", "one-tile"])
def test_flash_values_and_gradients_equal_xla_attention(t, block):
    """GQA over padding and packed segments, the row not a multiple of the tile: outputs and
    q/k/v gradients of a weighted sum over real queries equal the reference's (f32)."""
    q, k, v, seg = _inputs(t)
    real = np.asarray(seg) != 0
    out = jax.jit(lambda *a: flash_attention(*a, block=block))(q, k, v, seg)
    np.testing.assert_allclose(np.asarray(out)[real], np.asarray(_reference(q, k, v, seg))[real], atol=2e-6)
    assert np.all(np.asarray(out)[~real] == 0)  # padding queries output zeros
    w = jnp.asarray(np.random.RandomState(9).randn(*q.shape), jnp.float32) * real[:, :, None, None]
    flash_grads = jax.jit(jax.grad(lambda *a: jnp.sum(flash_attention(*a, seg, block=block) * w), (0, 1, 2)))(q, k, v)
    ref_grads = jax.grad(lambda *a: jnp.sum(_reference(*a, seg) * w), (0, 1, 2))(q, k, v)
    for name, a, b in zip("qkv", flash_grads, ref_grads):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, err_msg=name)


def test_flash_in_the_model_equals_xla_attention():
    """Qwen3's forward with attention_impl="flash" gives the XLA kernel's logits on real tokens."""
    config = tiny(vocab_size=512, compute_dtype="float32")  # attention is the check: a small LM head
    params = qwen3.init_params(config, jax.random.key(0))
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, config.vocab_size, (2, 40)), jnp.int32)
    seg = jnp.asarray([[1] * 40, [1] * 25 + [0] * 15], jnp.int32)
    logits = {impl: qwen3.forward(params, config.replace(attention_impl=impl), tokens, segment_ids_BT=seg)
              for impl in ("xla", "flash")}
    real = np.asarray(seg) != 0
    np.testing.assert_allclose(np.asarray(logits["flash"])[real], np.asarray(logits["xla"])[real], atol=2e-5)


def _grad_temp_bytes(fn, t):
    q = jax.ShapeDtypeStruct((1, t, 4, 32), jnp.float32)
    kv = jax.ShapeDtypeStruct((1, t, 2, 32), jnp.float32)
    seg = jax.ShapeDtypeStruct((1, t), jnp.int32)
    step = jax.jit(jax.grad(lambda q, k, v, s: jnp.sum(fn(q, k, v, s)), (0, 1, 2)))
    return step.lower(q, kv, kv, seg).compile().memory_analysis().temp_size_in_bytes


def test_flash_memory_grows_linearly_in_the_row():
    """XLA's memory analysis of forward + backward: quadrupling the row grows the flash
    kernel's temporaries < 4x (linear plus a constant), the XLA fallback's ~16x (T^2)."""
    flash = [_grad_temp_bytes(lambda *a: flash_attention(*a, block=128), t) for t in (1024, 4096)]
    causal = [_grad_temp_bytes(lambda q, k, v, s: attention.causal_attention(
        q, k, v, attention.attention_mask(s, s, jnp.broadcast_to(jnp.arange(q.shape[1]), s.shape),
                                          jnp.arange(q.shape[1]))), t) for t in (1024, 4096)]
    assert flash[1] / flash[0] < 4.0, flash
    assert causal[1] / causal[0] > 12.0, causal
    assert flash[1] * 20 < causal[1], (flash, causal)


def test_an_unknown_attention_impl_is_refused():
    with pytest.raises(ValueError, match="attention_impl"):
        tiny(attention_impl="flsh")
