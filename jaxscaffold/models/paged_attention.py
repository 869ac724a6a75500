"""Attention over a paged KV cache: one pool of pages per layer, a page table per row.

A row holds only the pages it has filled (`table_BN[b, :ceil(length / page)]`, page ids into
the pool), so a batch of mixed lengths reserves and reads what each row uses, not the longest
row's window. The model's cache (`qwen3.PagedKVCache`) stacks the pools over layers; the
sampler allocates pages on the host (`rollout.engine`); docs/design/kernels.md, section 2.

Layout, as JAX's TPU `paged_attention` kernel takes it: `k_pages, v_pages [G, P, page, K]`
(kv heads, pages, tokens a page, head dim). New tokens are written into their pages first
(`write_tokens`), then read with the cached ones (`attend`), by one of two reads:
- the gather (any backend, any number of queries): each row's pages up to the call's window
  gathered, a masked softmax in f32 (`gather_attention`);
- `decode_attention_tpu`, the Pallas kernel, one query a row, reading each row's own pages
  only. It applies no 1/sqrt(K) scale (queries are scaled here) and loads K and V as bf16
  whatever their dtype (jax 0.10.2), so it is used for bf16 caches only.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

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


def decode_attention_tpu(q_BHK, k_pages, v_pages, lengths_B, table_BN, *, pages_per_block: int = 1):
    """`decode_attention` with the Pallas TPU kernel (bf16 pages; `pages_per_block` must
    divide the table's width)."""
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention
    if k_pages.dtype != jnp.bfloat16 or v_pages.dtype != jnp.bfloat16:
        raise ValueError(f"the TPU paged kernel reads K and V as bf16: pages are {k_pages.dtype}, {v_pages.dtype}")
    scaled = q_BHK * (q_BHK.shape[-1] ** -0.5)
    return paged_attention(scaled, k_pages, v_pages, lengths_B, table_BN, pages_per_compute_block=pages_per_block)


@functools.partial(jax.named_call, name="paged_read")  # `bench.py decode_bytes` finds the read by this name
def attend(q_BTHK, k_pages, v_pages, lengths_B, table_BN, positions_BT, *, decode_kernel: Callable | None = None):
    """The paged layout's attention read (its new tokens already written): each row's
    queries over its first `lengths_B[b]` tokens. One query a row with a `decode_kernel`
    (`decode_attention`'s signature: the TPU kernel) runs that kernel; anything else, the
    gather. Rows with no token (sitting out a step) read one stale, finite slot: their
    output is discarded by the caller."""
    if decode_kernel is not None and q_BTHK.shape[1] == 1:
        return decode_kernel(q_BTHK[:, 0], k_pages, v_pages, jnp.maximum(lengths_B, 1), table_BN)[:, None]
    return gather_attention(q_BTHK, k_pages, v_pages, lengths_B, table_BN, positions_BT)
