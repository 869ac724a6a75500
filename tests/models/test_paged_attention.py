"""Decode attention over a paged KV cache equals the contiguous cache's, through page
boundaries and reused (stale) pages; the TPU kernel in interpret mode equals the gather path
for bf16 pages."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from jaxscaffold.models import attention, paged_attention

G, H, PAGE = 2, 4, 16
LENGTHS = np.array([5, 16, 37])  # inside a page, exactly one page, across two boundaries


def _case(d: int, dtype, seed: int = 0):
    """Cached tokens of three rows (contiguous), a new token a row, and a pool of pages full
    of another occupant's values (a reused slot) with each row's tokens written in."""
    rng = np.random.RandomState(seed)
    b, n, pool = len(LENGTHS), 3, 12
    s = n * PAGE
    cache_k, cache_v = (rng.randn(b, G, s, d).astype(np.float32) for _ in range(2))
    q = rng.randn(b, H, d).astype(np.float32)
    new_k, new_v = (rng.randn(b, G, d).astype(np.float32) for _ in range(2))
    table = rng.permutation(pool)[: b * n].reshape(b, n).astype(np.int32)  # rows' pages, scattered in the pool
    k_pages = jnp.asarray(rng.randn(G, pool, PAGE, d), dtype)  # stale values everywhere
    v_pages = jnp.asarray(rng.randn(G, pool, PAGE, d), dtype)
    for pos in range(LENGTHS.max()):
        rows = LENGTHS > pos
        position = np.where(rows, pos, LENGTHS)  # rows already full rewrite their next slot, overwritten below
        k_pages, v_pages = paged_attention.write_token(k_pages, v_pages, jnp.asarray(table), jnp.asarray(position),
                                                       jnp.asarray(cache_k[:, :, pos]), jnp.asarray(cache_v[:, :, pos]))
    k_pages, v_pages = paged_attention.write_token(k_pages, v_pages, jnp.asarray(table), jnp.asarray(LENGTHS),
                                                   jnp.asarray(new_k), jnp.asarray(new_v))
    if dtype == jnp.bfloat16:  # the contiguous reference holds the same (rounded) values
        cache_k, cache_v, new_k, new_v = (np.asarray(jnp.asarray(x, dtype).astype(jnp.float32))
                                          for x in (cache_k, cache_v, new_k, new_v))
    return q, cache_k, cache_v, new_k, new_v, table, k_pages, v_pages


def test_paged_decode_equals_the_contiguous_cache():
    q, cache_k, cache_v, new_k, new_v, table, k_pages, v_pages = _case(16, jnp.float32)
    seg = (np.arange(cache_k.shape[2])[None] < LENGTHS[:, None]).astype(np.int32)
    ref = attention.cached_attention(jnp.asarray(q)[:, None], jnp.asarray(cache_k), jnp.asarray(cache_v),
                                     jnp.asarray(new_k)[:, None], jnp.asarray(new_v)[:, None],
                                     cache_segment_BS=jnp.asarray(seg), segment_BT=jnp.ones((len(LENGTHS), 1), jnp.int32))
    out = paged_attention.decode_attention(jnp.asarray(q), k_pages, v_pages, jnp.asarray(LENGTHS + 1), jnp.asarray(table))
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref)[:, 0], atol=1e-5 * float(np.abs(ref).max()))


def test_tpu_kernel_in_interpret_mode_equals_the_gather_path():
    q, *_, table, k_pages, v_pages = _case(128, jnp.bfloat16, seed=1)
    lengths = jnp.asarray(LENGTHS + 1)
    ref = paged_attention.decode_attention(jnp.asarray(q), k_pages, v_pages, lengths, jnp.asarray(table))
    with pltpu.force_tpu_interpret_mode():
        out = paged_attention.decode_attention_tpu(jnp.asarray(q), k_pages, v_pages, lengths, jnp.asarray(table))
    assert float(jnp.max(jnp.abs(out - ref))) < 1e-5 * float(jnp.max(jnp.abs(ref)))
    with pytest.raises(ValueError, match="bf16"):
        paged_attention.decode_attention_tpu(jnp.asarray(q), k_pages.astype(jnp.float32), v_pages, lengths,
                                             jnp.asarray(table))
