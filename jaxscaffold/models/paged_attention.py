"""Decode attention over a paged KV cache: one pool of pages per layer, a page table per row.

A row holds only the pages it has filled (`table_BN[b, :ceil(length / page)]`, page ids into
the pool), so a batch of mixed lengths reserves and reads what each row uses, not the longest
row's window. This module is the kernel layer of the paged cache (docs/design/kernels.md);
the sampler's page allocation is not built yet.

Layout, as JAX's TPU `paged_attention` kernel takes it: `k_pages, v_pages [G, P, page, K]`
(kv heads, pages, tokens a page, head dim). Two reads of one decode step (a query per row):
- `decode_attention`: gathers each row's pages and runs a masked softmax in f32 (any backend);
- `decode_attention_tpu`: the Pallas kernel, reading each row's own pages. It applies no
  1/sqrt(K) scale (queries are scaled here) and loads K and V as bf16 whatever their dtype
  (jax 0.10.2), so it is used for bf16 caches only.
"""

from __future__ import annotations

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


def decode_attention(q_BHK, k_pages, v_pages, lengths_B, table_BN):
    """Attention of one query per row over its first `lengths_B[b]` cached tokens, gathered
    from its pages; scores and softmax in f32. Returns [B, H, K] in q's dtype."""
    b, h, d = q_BHK.shape
    g, _, page, _ = k_pages.shape
    n = table_BN.shape[1]
    k = k_pages[:, table_BN].reshape(g, b, n * page, d)  # [G, B, S, K]
    v = v_pages[:, table_BN].reshape(g, b, n * page, d)
    q = q_BHK.reshape(b, g, h // g, d).astype(jnp.float32) * (d ** -0.5)
    scores = jnp.einsum("bgrd,gbsd->bgrs", q, k.astype(jnp.float32))
    valid = jnp.arange(n * page)[None, :] < lengths_B[:, None]  # [B, S]
    scores = jnp.where(valid[:, None, None, :], scores, MASKED)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bgrs,gbsd->bgrd", probs, v.astype(jnp.float32))
    return out.reshape(b, h, d).astype(q_BHK.dtype)


def decode_attention_tpu(q_BHK, k_pages, v_pages, lengths_B, table_BN, *, pages_per_block: int = 1):
    """`decode_attention` with the Pallas TPU kernel (bf16 pages; `pages_per_block` must
    divide the table's width)."""
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention
    if k_pages.dtype != jnp.bfloat16 or v_pages.dtype != jnp.bfloat16:
        raise ValueError(f"the TPU paged kernel reads K and V as bf16: pages are {k_pages.dtype}, {v_pages.dtype}")
    scaled = q_BHK * (q_BHK.shape[-1] ** -0.5)
    return paged_attention(scaled, k_pages, v_pages, lengths_B, table_BN, pages_per_compute_block=pages_per_block)
