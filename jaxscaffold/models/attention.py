"""Grouped-query attention with three interchangeable implementations.

- `xla`: plain einsums + softmax in f32; runs on every backend and is the reference
  (`xla_attention`); self-attention runs it query block by query block (`causal_attention`).
- `flash`: blockwise over keys with an online softmax and a recomputing backward
  (`models.flash_attention`): O(T x block) memory where `xla` holds O(T^2 / 8) f32 scores;
  the long-row kernel of any backend without cuDNN / splash.
- `cudnn`: `jax.nn.dot_product_attention(implementation="cudnn")`, cuDNN flash attention on
  NVIDIA GPUs (bf16 / f16 only).
- `splash`: the Pallas splash-attention kernel on TPU (causal + segment ids, sequence
  lengths padded to the kernel's block size).
`cudnn` and `splash` are custom calls XLA cannot partition: on a mesh they run per device
under `shard_map` (`models.sharded_attention`).

With a KV cache (sampling), `cached_attention` is used on every backend: decode is bound by
reading weights and cache, and it reads the cache exactly once without copying it. (The CPU
backend's per-layer cache has its own, `backends.cpu.cache_attention`.)

Masks are built from two per-token arrays, so one convention covers right padding, left
padding, packing and KV caches:
  segment_ids: 0 marks padding; a query attends only to keys of its own non-zero segment;
  key_idx <= query_idx: causality, by position in the (cache + new tokens) buffer.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxscaffold.models import sharded_attention
from jaxscaffold.models.flash_attention import flash_attention

MASKED = -0.7 * float(np.finfo(np.float32).max)  # finite: fully masked rows stay NaN-free


def _acc(dtype):
    return jnp.promote_types(dtype, jnp.float32)


def attention_mask(q_segment_BT, kv_segment_BS, q_index_BT, kv_index_S):
    """Boolean mask_BTS: same non-padding segment and causal by buffer index."""
    same = (q_segment_BT[:, :, None] == kv_segment_BS[:, None, :]) & (kv_segment_BS[:, None, :] != 0)
    causal = kv_index_S[None, None, :] <= q_index_BT[:, :, None]
    return same & causal


def xla_attention(q_BTHK, k_BSGK, v_BSGK, mask_BTS):
    """Reference GQA attention; scores and softmax in f32."""
    b, t, h, d = q_BTHK.shape
    g = k_BSGK.shape[2]
    q = q_BTHK.reshape(b, t, g, h // g, d)
    scores = jnp.einsum("btgrd,bsgd->bgrts", q, k_BSGK, preferred_element_type=_acc(q.dtype))
    scores = scores * (d ** -0.5)
    scores = jnp.where(mask_BTS[:, None, None], scores, MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_BSGK.dtype)
    out = jnp.einsum("bgrts,bsgd->btgrd", probs, v_BSGK, preferred_element_type=_acc(q.dtype))
    return out.reshape(b, t, h, d).astype(q_BTHK.dtype)


_CAUSAL_BLOCKS = 8  # query blocks of `causal_attention`, at most
_MIN_BLOCK = 32  # tokens per query block, at least


def causal_attention(q_BTHK, k_BTGK, v_BTGK, mask_BTT):
    """`xla_attention` of a sequence over itself under a causal mask (no query sees a later
    key), in up to 8 query blocks that each read only the keys up to their end: the masked
    upper triangle is skipped, ~44% of the work at 8 blocks. ([8, 256] tokens, 12 heads:
    forward + backward 119 -> 55 ms on a 2-core CPU; PyTorch's SDPA 69 ms.) Equal to
    `xla_attention` but on fully masked (padding) queries, which average fewer values."""
    t = q_BTHK.shape[1]
    n = min(_CAUSAL_BLOCKS, t // _MIN_BLOCK)
    if n <= 1:
        return xla_attention(q_BTHK, k_BTGK, v_BTGK, mask_BTT)
    size = -(-t // n)
    return jnp.concatenate([xla_attention(q_BTHK[:, i:i + size], k_BTGK[:, :i + size], v_BTGK[:, :i + size],
                                          mask_BTT[:, i:i + size, :i + size]) for i in range(0, t, size)], axis=1)


def cudnn_attention(q_BTHK, k_BSGK, v_BSGK, mask_BTS):
    """cuDNN flash attention through `jax.nn.dot_product_attention` (GPU, bf16/f16)."""
    return jax.nn.dot_product_attention(
        q_BTHK, k_BSGK, v_BSGK, mask=mask_BTS[:, None], implementation="cudnn")


def cudnn_self_attention(q_BTHK, k_BTGK, v_BTGK, segment_ids_BT):
    """`cudnn_attention` of a sequence over itself, causal within segments."""
    b, t = segment_ids_BT.shape
    idx = jnp.arange(t)
    mask = attention_mask(segment_ids_BT, segment_ids_BT, jnp.broadcast_to(idx, (b, t)), idx)
    return cudnn_attention(q_BTHK, k_BTGK, v_BTGK, mask)


SPLASH_BLOCK = 128
# Run the splash kernel in Pallas interpret mode (a CPU test's setting; on TPU it compiles).
# `pltpu.force_tpu_interpret_mode()` cannot stand in: its interpreter fails on the kernel's
# 4-axis backward grid (jax 0.10.2).
SPLASH_INTERPRET = False


def splash_attention(q_BTHK, k_BTGK, v_BTGK, segment_ids_BT, *, interpret: bool | None = None):
    """Pallas splash attention (TPU): causal self-attention within segments, no cache.

    Sequences are padded up to a multiple of the kernel block with segment id 0. GQA runs
    as one MQA kernel per kv head. `interpret=True` runs the kernel on CPU for tests
    (None: `SPLASH_INTERPRET`).
    """
    interpret = SPLASH_INTERPRET if interpret is None else interpret
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    b, t, h, d = q_BTHK.shape
    g = k_BTGK.shape[2]
    pad = (-t) % SPLASH_BLOCK
    tp = t + pad

    def pad_seq(x):
        return jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))

    q = pad_seq(q_BTHK * (d ** -0.5)).reshape(b, tp, g, h // g, d).transpose(0, 2, 3, 1, 4)
    k = pad_seq(k_BTGK).transpose(0, 2, 1, 3)  # [B, G, T, K]
    v = pad_seq(v_BTGK).transpose(0, 2, 1, 3)
    seg = pad_seq(segment_ids_BT)
    # Padded keys get segment id 0 and real queries never attend to them; padded queries
    # attend to the padded keys only, which keeps every softmax row non-empty.
    mask = sm.MultiHeadMask([sm.CausalMask((tp, tp))] * (h // g))
    block = min(SPLASH_BLOCK, tp)
    sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                          block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                          block_q_dq=block, block_kv_dq=block)
    kernel = sk.make_splash_mqa_single_device(mask, block_sizes=sizes, interpret=interpret)

    def one_row(q_GRTK, k_GTK, v_GTK, seg_T):
        ids = sk.SegmentIds(q=seg_T, kv=seg_T)
        return jax.vmap(lambda qh, kh, vh: kernel(qh, kh, vh, segment_ids=ids))(q_GRTK, k_GTK, v_GTK)

    out = jax.vmap(one_row)(q, k, v, seg)  # [B, G, R, T, K]
    return out.transpose(0, 3, 1, 2, 4).reshape(b, tp, h, d)[:, :t].astype(q_BTHK.dtype)


def portable(impl: str) -> str:
    """The implementation the model runs for `impl`: "auto" is a platform backend's choice
    (`jaxscaffold.backends`: `with_attention` turns it into cudnn / splash / xla before the
    model sees it); left unresolved, the model runs the portable kernel."""
    return "xla" if impl == "auto" else impl


@functools.partial(jax.named_call, name="attention")
def attend(impl: str, q_BTHK, k_BSGK, v_BSGK, *, q_segment_BT, kv_segment_BS, q_index_BT, kv_index_S):
    """Self-attention of a whole sequence (no cache) with the chosen implementation: queries
    and keys are the same tokens (q_index_BT[:, t] = kv_index_S[t] = t)."""
    impl = portable(impl)
    if impl == "splash":
        return sharded_attention.on_mesh(splash_attention, q_BTHK, k_BSGK, v_BSGK, q_segment_BT)
    if impl == "flash":
        return flash_attention(q_BTHK, k_BSGK, v_BSGK, q_segment_BT)
    if impl == "cudnn":
        return sharded_attention.on_mesh(cudnn_self_attention, q_BTHK, k_BSGK, v_BSGK, q_segment_BT)
    mask = attention_mask(q_segment_BT, kv_segment_BS, q_index_BT, kv_index_S)
    if impl == "xla":  # queries and keys are the same tokens: causal by position
        return causal_attention(q_BTHK, k_BSGK, v_BSGK, mask)
    raise ValueError(f"unknown attention implementation {impl!r} (xla, flash, cudnn, splash)")


def grouped_queries(q_BTHK, g: int):
    """Scaled queries as [B, G, T, R, K] (R = heads per kv head): batch axes leading, like
    the cache [B, G, S, K], so the score einsums read both as they lie."""
    b, t, h, d = q_BTHK.shape
    return (q_BTHK.reshape(b, t, g, h // g, d) * (d ** -0.5)).transpose(0, 2, 1, 3, 4)


@functools.partial(jax.named_call, name="cached_attention")
def cached_attention(q_BTHK, cache_k_BGSK, cache_v_BGSK, k_BTGK, v_BTGK, *, cache_segment_BS, segment_BT):
    """Attention of new tokens over [cached tokens; new tokens] without concatenating the
    cache: the two score blocks share one softmax. Every valid cache slot precedes the new
    tokens; among the new (right-padded) tokens attention is causal within a segment. The
    cache is read as it lies ([B, G, S, K]: batch axes leading, so no transposed copy)."""
    b, t = q_BTHK.shape[:2]
    acc = _acc(q_BTHK.dtype)
    q = grouped_queries(q_BTHK, cache_k_BGSK.shape[1])
    s_old = jnp.einsum("bgtrd,bgsd->bgtrs", q, cache_k_BGSK, preferred_element_type=acc)
    s_new = jnp.einsum("bgtrd,bsgd->bgtrs", q, k_BTGK, preferred_element_type=acc)
    old_ok = (cache_segment_BS != 0)[:, None, None, None, :]  # [B, 1, 1, 1, S]
    idx = jnp.arange(t)
    new_ok = attention_mask(segment_BT, segment_BT, jnp.broadcast_to(idx, (b, t)), idx)  # [B, T, T]
    s_old = jnp.where(old_ok, s_old, MASKED)
    s_new = jnp.where(new_ok[:, None, :, None, :], s_new, MASKED)
    m = jnp.maximum(jnp.max(s_old, -1, keepdims=True), jnp.max(s_new, -1, keepdims=True))
    p_old, p_new = jnp.exp(s_old - m), jnp.exp(s_new - m)
    norm = jnp.sum(p_old, -1, keepdims=True) + jnp.sum(p_new, -1, keepdims=True)
    dt = cache_v_BGSK.dtype
    out = (jnp.einsum("bgtrs,bgsd->bgtrd", (p_old / norm).astype(dt), cache_v_BGSK, preferred_element_type=acc)
           + jnp.einsum("bgtrs,bsgd->bgtrd", (p_new / norm).astype(dt), v_BTGK, preferred_element_type=acc))
    return out.transpose(0, 2, 1, 3, 4).reshape(q_BTHK.shape).astype(q_BTHK.dtype)
