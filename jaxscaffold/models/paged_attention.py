"""Attention over a paged KV cache: one pool of pages per layer, a page table per row.

A row holds only the pages it has filled (`table_BN[b, :ceil(length / page)]`, page ids into
the pool), so a batch of mixed lengths reserves and reads what each row uses, not the longest
row's window. The model's cache (`qwen3.PagedKVCache`) stacks the pools over layers; the
sampler allocates pages on the host (`rollout.engine`); docs/design/kernels.md, section 2.

Layout: `k_pages, v_pages [G, P, page, K]` (kv heads, pages, tokens a page, head dim), per
layer; the model stacks them over layers. New tokens are written into their pages first
(`write_tokens`, a scatter straight into the pool: no contiguous copy), then read with the
cached ones (`attend`), by one of two reads:
- the Pallas kernel (`models.paged_kernel`: the TPU's read, and the CPU tests' in interpret
  mode): any number of queries a row (decode, prefill, extends), each row's own pages only,
  in the pool's dtype (bf16 or f32);
- the gather (every other backend): each row's pages up to the call's window gathered into a
  dense `[G, B, S, K]` temporary, a masked softmax in f32 (`gather_attention`).
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxscaffold.models import sharded_attention
from jaxscaffold.models.attention import MASKED


def write_token(k_pages, v_pages, table_BN, position_B, k_BGK, v_BGK):
    """The pools with each row's new token written at its `position_B` (page
    `table_BN[b, position // page]`, slot `position % page`)."""
    page = k_pages.shape[2]
    rows = jnp.arange(table_BN.shape[0])
    page_id = table_BN[rows, position_B // page]
    slot = position_B % page
    # [G, B, K] updates at (all kv heads, page_id[b], slot[b]).
    k_pages = k_pages.at[:, page_id, slot].set(k_BGK.transpose(1, 0, 2).astype(k_pages.dtype))
    v_pages = v_pages.at[:, page_id, slot].set(v_BGK.transpose(1, 0, 2).astype(v_pages.dtype))
    return k_pages, v_pages


def token_places(table_BN, positions_BT, segment_ids_BT, *, page: int, num_pages: int):
    """(page id, slot in the page) of each new token at `positions_BT`; padding (segment 0)
    and positions past the table get page id `num_pages`, out of the pool, so their writes
    are dropped."""
    index = positions_BT // page
    inside = (segment_ids_BT != 0) & (index < table_BN.shape[1])
    page_id = jnp.take_along_axis(table_BN, jnp.minimum(index, table_BN.shape[1] - 1), axis=1)
    return jnp.where(inside, page_id, num_pages), positions_BT % page


def write_tokens(k_pages, v_pages, page_id_BT, slot_BT, k_BTGK, v_BTGK, *, layer=None):
    """The pools with new tokens written at (page_id, slot); out-of-pool page ids (padding)
    are dropped, so they never overwrite a cached token. With `layer`, the pools are stacked
    over layers ([L, G, P, page, K]) and that layer's are written: one scatter into the
    stacked pools, in place in a layer loop that carries them."""
    if layer is None:
        k_new, v_new = jnp.moveaxis(k_BTGK, 2, 0), jnp.moveaxis(v_BTGK, 2, 0)  # [G, B, T, K]
        index = (slice(None), page_id_BT, slot_BT)
    else:  # the index arrays are split by the heads' slice: their axes (B, T) lead
        k_new, v_new, index = k_BTGK, v_BTGK, (layer, slice(None), page_id_BT, slot_BT)
    k_pages = k_pages.at[index].set(k_new.astype(k_pages.dtype), mode="drop")
    v_pages = v_pages.at[index].set(v_new.astype(v_pages.dtype), mode="drop")
    return k_pages, v_pages


def gather_attention(q_BTHK, k_pages, v_pages, lengths_B, table_BN, positions_BT):
    """Attention of each row's queries (at `positions_BT`) over its first `lengths_B[b]`
    tokens, gathered from its pages (the table's width: the call's window), causal by
    position; scores and softmax in (at least) f32. Returns [B, T, H, K] in q's dtype."""
    b, t, h, d = q_BTHK.shape
    g, _, page, _ = k_pages.shape
    n = table_BN.shape[1]
    # Keys and values in q's dtype, products accumulated in f32 (as `attention.cached_attention`
    # reads a contiguous cache): a bf16 pool is read as it lies, not widened to f32 first.
    dt = q_BTHK.dtype
    k = k_pages[:, table_BN].reshape(g, b, n * page, d).astype(dt)  # [G, B, S, K]
    v = v_pages[:, table_BN].reshape(g, b, n * page, d).astype(dt)
    acc = jnp.promote_types(dt, jnp.float32)
    q = q_BTHK.reshape(b, t, g, h // g, d) * (d ** -0.5)
    scores = jnp.einsum("btgrd,gbsd->bgrts", q, k, preferred_element_type=acc)
    s = jnp.arange(n * page)
    valid = (s[None, None, :] < lengths_B[:, None, None]) & (s[None, None, :] <= positions_BT[:, :, None])  # [B, T, S]
    scores = jnp.where(valid[:, None, None], scores, MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(dt)
    out = jnp.einsum("bgrts,gbsd->btgrd", probs, v, preferred_element_type=acc)
    return out.reshape(b, t, h, d).astype(dt)


def decode_attention(q_BHK, k_pages, v_pages, lengths_B, table_BN):
    """Attention of one query per row over its first `lengths_B[b]` cached tokens, gathered
    from its pages; scores and softmax in (at least) f32. Returns [B, H, K] in q's dtype."""
    positions = jnp.maximum(lengths_B - 1, 0)[:, None]  # the query is the last token: sees them all
    return gather_attention(q_BHK[:, None], k_pages, v_pages, lengths_B, table_BN, positions)[:, 0]


@functools.partial(jax.named_call, name="paged_read")  # `bench.py decode_bytes` finds the read by this name
def attend(q_BTHK, k_pools, v_pools, layer, lengths_B, table_BN, positions_BT, *, kernel: Callable | None = None):
    """The paged layout's attention read (its new tokens already written): each row's
    queries (at `positions_BT`, consecutive from `positions_BT[:, 0]`) over its first
    `lengths_B[b]` tokens, from the pools stacked over layers (`[L, G, P, page, K]`) at
    `layer`. With a `kernel` (`paged_kernel.paged_attention`'s signature: the TPU's) that
    kernel reads the row's pages; else the gather. Rows with no token (sitting out a call)
    get a finite output, which the caller discards."""
    if kernel is not None:
        return kernel(q_BTHK, k_pools, v_pools, layer, lengths_B, positions_BT[:, 0], table_BN)
    k_pages, v_pages = (jax.lax.dynamic_index_in_dim(p, layer, keepdims=False) for p in (k_pools, v_pools))
    return gather_attention(q_BTHK, k_pages, v_pages, lengths_B, table_BN, positions_BT)


def write_and_attend(q_BTHK, k_BTGK, v_BTGK, pools, layer, places, lengths_B, table_BN, positions_BT, *,
                     kernel: Callable | None = None):
    """One layer's paged attention: its new keys / values written into their pages
    (`places`: `token_places`), then `attend`. Returns (output, pools).

    On the mesh the step is traced under (`sharded_attention.kernel_mesh`), each device runs
    it on its own rows and kv heads and on its own part of the pool: the pool's pages are
    split over the same batch axes as the rows, and the sampler (`rollout.pages.PageTable`,
    shards) gives each row pages from its device's part only, so the table's global page ids
    become local ones by subtracting the part's first page; nothing crosses devices."""
    mesh, rules = sharded_attention.traced_mesh()

    def local(q, k, v, k_pools, v_pools, layer, page_id, slot, lengths, table, positions, first_page=0):
        pools = write_tokens(k_pools, v_pools, page_id - first_page, slot, k, v, layer=layer)
        return attend(q, *pools, layer, lengths, table - first_page, positions, kernel=kernel), pools

    args = (q_BTHK, k_BTGK, v_BTGK, *pools, layer, *places, lengths_B, table_BN, positions_BT)
    if mesh.empty or mesh.size == 1:
        return local(*args)
    rows, heads = sharded_attention.paged_axes(mesh, q_BTHK.shape[0], k_BTGK.shape[2], rules)
    per_shard = pools[0].shape[2] // math.prod(mesh.shape[a] for a in rows)

    def on_device(*args):
        first = jax.lax.axis_index(rows) * per_shard if rows else 0
        return local(*args, first_page=first)

    r, h = rows or None, heads or None
    act, pool, per_row = P(r, None, h, None), P(None, h, r, None, None), P(r, None)
    specs = (act, act, act, pool, pool, P(), per_row, per_row, P(r), per_row, per_row)
    # check_vma off: a Pallas call carries no varying-axes annotations to check.
    return jax.shard_map(on_device, mesh=mesh, in_specs=specs, out_specs=(act, (pool, pool)), check_vma=False)(*args)
