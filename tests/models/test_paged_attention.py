"""Attention over a paged KV cache equals the contiguous cache's, through page boundaries and
reused (stale) pages: the gather read, and the Pallas kernel (`paged_kernel`, the TPU's read)
in interpret mode, at f32 within 1e-5 of a NumPy softmax reference for prefill and extends,
and at bf16 under the TPU interpreter; why JAX's own decode kernel is not used."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from jaxscaffold.models import attention, paged_attention, paged_kernel

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


def _pools(rng, lengths, layers: int, d: int, dtype):
    """Contiguous keys / values of each row ([B, G, S, K], the reference's) and the same
    tokens in a stacked pool of stale pages ([L, G, P, page, K]) at the last layer, each row's
    pages scattered over the pool."""
    b, n = len(lengths), 4
    pool = b * n + 3
    keys, values = (rng.randn(b, G, n * PAGE, d).astype(np.float32) for _ in range(2))
    if dtype == jnp.bfloat16:
        keys, values = (np.asarray(jnp.asarray(x, dtype).astype(jnp.float32)) for x in (keys, values))
    table = (rng.permutation(pool - 1)[: b * n] + 1).reshape(b, n).astype(np.int32)
    k_pools, v_pools = (rng.randn(layers, G, pool, PAGE, d).astype(np.float32) for _ in range(2))
    for row in range(b):
        for pos in range(lengths[row]):
            k_pools[-1, :, table[row, pos // PAGE], pos % PAGE] = keys[row, :, pos]
            v_pools[-1, :, table[row, pos // PAGE], pos % PAGE] = values[row, :, pos]
    return keys, values, jnp.asarray(table), jnp.asarray(k_pools, dtype), jnp.asarray(v_pools, dtype)


def _softmax_reference(q, keys, values, lengths, starts):
    """NumPy, f64: query t of row b (at position starts[b] + t) over the row's tokens at
    positions <= its own and < lengths[b]."""
    b, t, h, d = q.shape
    out = np.zeros((b, t, h, d))
    for row in range(b):
        for i in range(t):
            seen = min(lengths[row], starts[row] + i + 1)
            for head in range(h):
                k, v = keys[row, head // (h // G), :seen], values[row, head // (h // G), :seen]
                scores = k.astype(np.float64) @ q[row, i, head] / np.sqrt(d)
                w = np.exp(scores - scores.max())
                out[row, i, head] = (w / w.sum()) @ v
    return out


# A prefill from empty across a page boundary, an extend starting mid-page, a row sitting out
# the call (its queries are padding), an extend ending exactly on a page boundary.
STARTS, NEW = np.array([0, 11, 37, 40]), np.array([21, 9, 0, 8])


@pytest.mark.parametrize("pages_per_block, tokens_per_tile", [(1, None), (3, 4), (None, 128)])
def test_the_kernel_with_f32_pages_equals_a_softmax_reference(pages_per_block, tokens_per_tile):
    """Prefill and extends: many queries a row, each over its own pages (the stacked pools'
    last layer), in Pallas interpret mode, f32 throughout: within 1e-5 of the largest entry."""
    rng = np.random.RandomState(0)
    lengths = STARTS + NEW
    keys, values, table, k_pools, v_pools = _pools(rng, lengths, layers=2, d=16, dtype=jnp.float32)
    q = rng.randn(len(STARTS), NEW.max(), H, 16).astype(np.float32)
    out = paged_kernel.paged_attention(jnp.asarray(q), k_pools, v_pools, 1, jnp.asarray(lengths), jnp.asarray(STARTS),
                                       table, pages_per_block=pages_per_block, tokens_per_tile=tokens_per_tile,
                                       interpret=True)
    ref = _softmax_reference(q, keys, values, lengths, STARTS)
    real = np.arange(NEW.max())[None] < NEW[:, None]  # padding queries' outputs are discarded
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_allclose(np.asarray(out)[real], ref[real], rtol=0, atol=1e-5 * np.abs(ref).max())
    # The gather read (the other backends') agrees on the same pools.
    positions = jnp.asarray(STARTS[:, None] + np.arange(NEW.max())[None])
    gathered = paged_attention.attend(jnp.asarray(q), k_pools, v_pools, 1, jnp.asarray(lengths), table, positions)
    np.testing.assert_allclose(np.asarray(gathered)[real], ref[real], rtol=0, atol=1e-5 * np.abs(ref).max())


def test_the_kernel_with_bf16_pages_in_the_tpu_interpreter_equals_the_gather():
    """Decode (one query a row) on bf16 pages under the TPU interpreter: the gather's values;
    a row with no tokens gets zeros, not NaN."""
    rng = np.random.RandomState(1)
    lengths = np.array([5, 16, 37, 0])
    _, _, table, k_pools, v_pools = _pools(rng, lengths, layers=1, d=128, dtype=jnp.bfloat16)
    q = jnp.asarray(rng.randn(len(lengths), 1, H, 128), jnp.bfloat16)
    starts = jnp.asarray(np.maximum(lengths - 1, 0))
    with pltpu.force_tpu_interpret_mode():
        out = paged_kernel.paged_attention(q, k_pools, v_pools, 0, jnp.asarray(lengths), starts, table,
                                           pages_per_block=2)
    ref = paged_attention.attend(q, k_pools, v_pools, 0, jnp.asarray(lengths), table, starts[:, None])
    out, ref = np.asarray(out.astype(jnp.float32)), np.asarray(ref.astype(jnp.float32))
    assert np.abs(out[3]).max() == 0
    np.testing.assert_allclose(out[:3], ref[:3], rtol=0, atol=1e-2 * np.abs(ref).max())  # bf16 outputs


def test_jaxs_decode_kernel_rounds_f32_pages_to_bf16():
    """Why the project has its own kernel: JAX's `paged_attention` (jax 0.10.2) loads f32
    pages as bf16 (and applies no 1/sqrt(K) scale), so on f32 pages it misses the f32
    reference by bf16 rounding, and matches one whose keys and values are rounded to bf16."""
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention as jax_paged_attention
    q, cache_k, cache_v, new_k, new_v, table, k_pages, v_pages = _case(128, jnp.float32, seed=1)
    lengths = jnp.asarray(LENGTHS + 1)
    with pltpu.force_tpu_interpret_mode():
        out = np.asarray(jax_paged_attention(jnp.asarray(q) / np.sqrt(128), k_pages, v_pages, lengths, jnp.asarray(table),
                                             pages_per_compute_block=1))
    exact = np.asarray(paged_attention.decode_attention(jnp.asarray(q), k_pages, v_pages, lengths, jnp.asarray(table)))
    rounded = np.asarray(paged_attention.decode_attention(jnp.asarray(q), k_pages.astype(jnp.bfloat16),
                                                          v_pages.astype(jnp.bfloat16), lengths, jnp.asarray(table)))
    scale = np.abs(exact).max()
    assert np.abs(out - exact).max() > 1e-3 * scale
    assert np.abs(out - rounded).max() < 1e-5 * scale
