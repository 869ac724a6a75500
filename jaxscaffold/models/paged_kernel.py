"""A Pallas kernel for attention over a paged KV cache: any number of queries a row (decode,
prefill, multi-turn extends), each row reading its own pages only, in the pool's dtype (bf16 or f32).

The TPU backend runs it compiled (Mosaic); the CPU tests run the same `pallas_call` in
interpret mode (`INTERPRET`, or `interpret=True`). Why our own and not JAX's: on jax 0.10.2
`ragged_paged_attention` fails inside the TPU interpreter, and the decode-only
`paged_attention` loads K and V as bf16 whatever their dtype (docs/design/kernels.md, 2).

Grid (row, query tile, page block). The page table, the rows' lengths and first query
positions and the layer index are scalar-prefetch arguments: a page block's index map reads
the row's page ids from the table, so the pipeline copies only that row's pages (into VMEM),
and blocks past what a row's queries can see repeat the row's last needed page (the pipeline
skips a copy whose block index has not changed) and compute nothing. Each step folds
`pages_per_block` pages into an online softmax (running max, sum and output in f32 scratch);
the last step writes the tile's output.

Shapes: q `[B, T, H, K]` (H = G * R query heads, R a kv head's group), pools stacked over
layers `[L, G, P, page, K]` (read at `layer`, no per-layer copy), table `[B, N]` page ids,
`lengths [B]` tokens each row holds (the new ones written), `starts [B]` the position of each
row's first query; query t of row b sits at `starts[b] + t` and sees the row's tokens at
positions <= its own and < `lengths[b]`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

INTERPRET = False  # tests set it: the kernel run by the Pallas interpreter (CPU)
LANES = 128  # the running max and sum are kept lane-wide, as TPU vector registers hold them


def _kernel(layer_ref, lengths_ref, starts_ref, table_ref, q_ref, *refs, pages_per_block: int, page: int,
            tokens_per_tile: int, group: int):
    del layer_ref, table_ref  # read by the index maps
    n = pages_per_block
    k_refs, v_refs, o_ref = refs[:n], refs[n:2 * n], refs[2 * n]
    m_ref, l_ref, acc_ref = refs[2 * n + 1:]
    b, tile, block = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    kv_heads, rows, _ = q_ref.shape  # rows: tokens_per_tile * group, query t's heads at t * group + r
    length, start = lengths_ref[b], starts_ref[b]
    first_query = start + tile * tokens_per_tile
    seen = jnp.minimum(length, first_query + tokens_per_tile)  # tokens any query of the tile sees

    @pl.when(block == 0)
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    row = jax.lax.broadcasted_iota(jnp.int32, (rows, page), 0)  # query (row // group)'s head (row % group)
    for i in range(n):
        first_token = (block * n + i) * page

        @pl.when(first_token < seen)
        def _page(i=i, first_token=first_token):
            key_pos = first_token + jax.lax.broadcasted_iota(jnp.int32, (rows, page), 1)
            # Causal: key_pos - first_query <= row // group, written without a vector division.
            visible = (key_pos < length) & ((key_pos - first_query) * group <= row)
            for g in range(kv_heads):
                # K and V in q's dtype, products accumulated in f32 (as the gather reads them).
                q, k, v = q_ref[g], k_refs[i][g].astype(q_ref.dtype), v_refs[i][g].astype(q_ref.dtype)
                precision = jax.lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
                s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=precision,
                                        preferred_element_type=jnp.float32)  # [rows, page]
                s = jnp.where(visible, s, -jnp.inf)
                m_prev = m_ref[g][:, :1]
                m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
                # A row none of whose keys is visible yet keeps m = -inf: exp of -inf - -inf is NaN,
                # so its weights are set to zero rather than computed.
                p = jnp.where(visible, jnp.exp(s - jnp.where(m_new == -jnp.inf, 0.0, m_new)), 0.0)
                alpha = jnp.where(m_prev == -jnp.inf, 0.0, jnp.exp(m_prev - m_new))
                l_ref[g] = jnp.broadcast_to(alpha * l_ref[g][:, :1] + jnp.sum(p, axis=1, keepdims=True),
                                            (rows, LANES))
                m_ref[g] = jnp.broadcast_to(m_new, (rows, LANES))
                pv = jax.lax.dot_general(p.astype(q.dtype), v, (((1,), (0,)), ((), ())), precision=precision,
                                         preferred_element_type=jnp.float32)
                acc_ref[g] = alpha * acc_ref[g] + pv

    @pl.when(block == pl.num_programs(2) - 1)
    def _write():
        total = l_ref[...][:, :, :1]
        o_ref[...] = (acc_ref[...] / jnp.where(total == 0.0, 1.0, total)).astype(o_ref.dtype)


def paged_attention(q_BTHK, k_pools, v_pools, layer, lengths_B, starts_B, table_BN, *,
                    pages_per_block: int | None = None, tokens_per_tile: int | None = 128,
                    interpret: bool | None = None):
    """Attention of each row's queries over its own pages (see the module's docstring);
    scores and softmax in f32, K and V read in the pools' dtype, q scaled by 1/sqrt(K) in
    its dtype (as `paged_attention.gather_attention` does). Returns [B, T, H, K] in q's dtype.
    Rows with no visible token (sitting out a call) get zeros.

    pages_per_block: pages folded per grid step (the table is padded to a multiple with the
      scratch page, never read past a row's length; None: 512 tokens' worth, within the
      table). tokens_per_tile: queries a grid step holds (None: all T; the queries are padded
      to a multiple). Both defaults are guesses for TPU VMEM, not yet timed on a TPU.
      interpret: run the Pallas interpreter (None: `INTERPRET`)."""
    b, t, h, d = q_BTHK.shape
    _, g, _, page, _ = k_pools.shape
    r = h // g
    tq = t if tokens_per_tile is None else min(tokens_per_tile, t)
    tiles = -(-t // tq)
    n = pages_per_block or min(max(1, 512 // page), table_BN.shape[1])
    blocks = -(-table_BN.shape[1] // n)
    table = jnp.pad(table_BN, ((0, 0), (0, blocks * n - table_BN.shape[1]))).astype(jnp.int32)
    width = table.shape[1]
    q = (q_BTHK * (d ** -0.5)).astype(q_BTHK.dtype)
    q = jnp.pad(q, ((0, 0), (0, tiles * tq - t), (0, 0), (0, 0)))
    # [B, G, T * R, K]: a kv head's queries, token-major, so a query tile is a contiguous block.
    q = q.reshape(b, tiles * tq, g, r, d).transpose(0, 2, 1, 3, 4).reshape(b, g, tiles * tq * r, d)

    def page_map(i):
        def index(row, tile, block, layer_ref, lengths_ref, starts_ref, table_ref):
            seen = jnp.minimum(lengths_ref[row], starts_ref[row] + (tile + 1) * tq)
            last = jnp.clip((seen - 1) // page, 0, width - 1)  # past it: the same block, no copy
            return layer_ref[0], 0, table_ref[row * width + jnp.minimum(block * n + i, last)], 0, 0
        return index

    page_spec = [pl.BlockSpec((None, g, None, page, d), page_map(i)) for i in range(n)]
    q_spec = pl.BlockSpec((None, g, tq * r, d), lambda row, tile, block, *_: (row, 0, tile, 0))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=4, grid=(b, tiles, blocks),
        in_specs=[q_spec, *page_spec, *page_spec], out_specs=q_spec,
        scratch_shapes=[pltpu.VMEM((g, tq * r, LANES), jnp.float32), pltpu.VMEM((g, tq * r, LANES), jnp.float32),
                        pltpu.VMEM((g, tq * r, d), jnp.float32)])
    kernel = functools.partial(_kernel, pages_per_block=n, page=page, tokens_per_tile=tq, group=r)
    out = pl.pallas_call(
        kernel, grid_spec=grid_spec, out_shape=jax.ShapeDtypeStruct(q.shape, q_BTHK.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=INTERPRET if interpret is None else interpret,
    )(jnp.reshape(layer, (1,)).astype(jnp.int32), lengths_B.astype(jnp.int32), starts_B.astype(jnp.int32),
      table.reshape(-1), q, *([k_pools] * n), *([v_pools] * n))
    out = out.reshape(b, g, tiles * tq, r, d).transpose(0, 2, 1, 3, 4).reshape(b, tiles * tq, h, d)
    return out[:, :t]
