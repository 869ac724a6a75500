"""XLA:CPU: the per-layer decode layout, the bf16 cache stored as bits, the dense layers'
custom VJP and gather-as-bits embedding for training, and the compiler options.

Every choice here was measured on XLA:CPU (the ~100M benchmark model at batch 8 unless said
otherwise); none changes a value: the decode layout gives the stacked model's tokens, the
kernels its forward values.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os

import jax
import jax.numpy as jnp
from jax import lax

from jaxscaffold.models import attention, qwen3
from jaxscaffold.models.config import Qwen3Config

# ----------------------------------------------------------------------------- compiler options

# XLA:CPU runs dots in YNNPACK. By default a dot of bf16 operands accumulating in f32 takes
# YNNPACK's bf16 kernel, slow on a CPU without bf16 dot instructions (AVX2); with YNNPACK's
# dot fusion asked for, the bf16 -> f32 widening is fused into the dot and its f32 kernel
# runs. Measured on such a CPU: 24 matrices [4096, 768] times 8 rows, 13 ms against 22 ms
# (f32: 14 ms either way); in interleaved runs, a bf16 decode step of the ~100M benchmark model
# 27.0 against 36.4 ms (f32: 25.0 against 25.7 ms). A bf16 train step of that model ran at the
# same speed with and without (10.4 s), so train steps keep XLA's defaults. CPUs with bf16 dot
# instructions keep YNNPACK's individual dots (their bf16 kernel is the fast one).
# By default YNNPACK also takes the larger reductions (from about 4096 elements) and sums a row
# in an order that depends on the whole array's shape: a row's softmax then rounds differently
# in a batch of 8 than of 4, and at T = 1 over a nearly flat vocabulary a last-bit difference
# picks the neighbouring token now and then (multi-host rollouts sample their rows in smaller
# batches than one host: tests/rollout/test_batch_invariance.py). Either option keeps
# reductions in XLA's own emitters, whose order per row is the same whatever the batch. Cost on
# a Zen 5 CPU (AVX-512 bf16): the tiny test model's decode step 6.9 -> 8.5 ms (its reductions
# over a 151936 vocabulary), the ~100M model's unchanged (~29 ms, bf16, batch 8).
_CPU_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"}  # XLA_FLAGS spells it "dot"
_BF16_CPU_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}
_BF16_DOT_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86, and Arm's `Features` line


@functools.cache
def cpu_has_bf16_dots(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the host CPU advertises bf16 dot-product instructions (Linux; else False)."""
    try:
        with open(cpuinfo) as f:
            words = set(f.read().split())
    except OSError:
        return False
    return any(flag in words for flag in _BF16_DOT_FLAGS)


def compiler_options() -> dict[str, str] | None:
    """XLA options of the sampler's programs on this host's CPU."""
    return dict(_BF16_CPU_OPTIONS if cpu_has_bf16_dots() else _CPU_OPTIONS)


def default_column_blocks(mesh=None) -> int:
    """Column blocks of the decode layout: one per core, at most 4, on an unsharded CPU
    sampler (independent small dots run on different cores; a one-device mesh, a host's
    own on several processes, is unsharded too); else 1."""
    sharded = mesh is not None and getattr(mesh, "size", None) != 1
    if sharded or jax.default_backend() != "cpu":
        return 1
    return min(os.cpu_count() or 1, 4)


# ----------------------------------------------------------------------------- training kernels


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def dense(x, w_DF, acc):
    """x @ w_DF accumulated in `acc`: autodiff's own product, with the weight gradient taken
    as x^T @ dy, x^T materialised (the smaller operand). Left to itself, XLA:CPU transposes dy
    instead, in a strided loop fused into dy's producer, and contracts the token axis of x in
    place: an MLP block's forward + backward, [8, 256, 768] -> 2048, 568 ms against 429 ms this
    way (PyTorch: 537 ms)."""
    return jnp.einsum("...d,df->...f", x, w_DF, preferred_element_type=acc)


def _dense_fwd(x, w_DF, acc):
    return dense(x, w_DF, acc), (x, w_DF)


def _dense_bwd(acc, residuals, dy):
    x, w_DF = residuals
    dx = jnp.einsum("...f,df->...d", dy, w_DF, preferred_element_type=acc).astype(x.dtype)
    x_DN = lax.optimization_barrier(x.reshape(-1, x.shape[-1]).T)  # barrier: XLA would fold it back
    dw = jnp.einsum("dn,nf->df", x_DN, dy.reshape(-1, dy.shape[-1]), preferred_element_type=acc)
    return dx, dw.astype(w_DF.dtype)


dense.defvjp(_dense_fwd, _dense_bwd)


def embed_rows(embed_VD, tokens_BT):
    """embed[tokens]; 16-bit tables are gathered as their bits (XLA:CPU would otherwise
    convert the whole table to f32 for every call)."""
    if embed_VD.dtype.itemsize != 2:
        return jnp.take(embed_VD, tokens_BT, axis=0)
    rows = jnp.take(lax.bitcast_convert_type(embed_VD, jnp.uint16), tokens_BT, axis=0)
    return lax.bitcast_convert_type(rows, embed_VD.dtype)


KERNELS = qwen3.Kernels(dense=dense, embed_rows=embed_rows)

# ----------------------------------------------------------------------------- decode layout

_FUSED = {qwen3.QKV: "qkv", qwen3.O: "o", qwen3.GATE_UP: "gate_up", qwen3.DOWN: "down"}
_MATRICES = ("q", "k", "v", "o", "gate", "up", "down")


def is_prepared(params: dict) -> bool:
    """Whether `params` are in the decode layout (per-layer dicts) rather than stacked."""
    return isinstance(params["layers"], (tuple, list))


def decode_layout(params: dict, config: Qwen3Config, blocks: int = 1) -> dict:
    """The stacked weights laid out for fast small-batch decoding on CPU.

    `layers` becomes a tuple of per-layer dicts with q/k/v fused into `qkv` and gate/up into
    `gate_up`, and every matrix (and the unembedding, as `lm_head`) a tuple of `blocks`
    blocks of its transpose, [out / blocks, in] each. Why, on XLA:CPU at batch 8: a layer's
    slice of stacked weights is copied before each matmul (under scan or a static index),
    doubling the memory traffic; [out, in] weights are read about 1.2x (f32) to 1.8x (bf16)
    faster than [in, out]; and one small-batch dot runs on one core while independent dots run
    on different cores, so blocks put every core to work.
    """

    def split(w_OI):
        if blocks <= 1 or w_OI.shape[0] % blocks:
            return (w_OI,)
        return tuple(jnp.split(w_OI, blocks, axis=0))

    stacked = params["layers"]
    n = jax.tree.leaves(stacked)[0].shape[0]
    layers = []
    for i in range(n):
        layer = {name: w[i] for name, w in stacked.items() if name not in _MATRICES}
        # Matrices reading the same input are fused (fewer, larger dots: a decode step of a
        # small model is bound by the number of ops).
        layer["qkv"] = split(jnp.concatenate([stacked["q"][i], stacked["k"][i], stacked["v"][i]], axis=1).T)
        layer["gate_up"] = split(jnp.concatenate([stacked["gate"][i], stacked["up"][i]], axis=1).T)
        layer["o"], layer["down"] = split(stacked["o"][i].T), split(stacked["down"][i].T)
        layers.append(layer)
    out = {**params, "layers": tuple(layers)}
    if not config.is_embedding:
        out["lm_head"] = split(params["lm_head"].T if config.has_lm_head else params["embed"])
    return out


_FEW_ROWS = 32  # from 2 to this many rows, matmuls run in row panels, out-major
_ROW_PANEL = 8  # rows per panel


def _matmul(x, blocks_FD: tuple, dtype):
    """x @ w with inputs in `dtype`, accumulated and returned in (at least) f32, `w` given as a
    tuple of [out_block, in] blocks of its transpose (`decode_layout`)."""
    acc = qwen3.acc_dtype(dtype)
    lead, rows = x.shape[:-1], math.prod(x.shape[:-1])
    x_RD = x.reshape(rows, x.shape[-1]).astype(dtype)
    w = tuple(block_FD.astype(dtype) for block_FD in blocks_FD)  # once per block, not per panel
    if rows == 1 or rows > _FEW_ROWS:
        # One row (batch 1, e.g. the chat server) takes XLA's matrix-vector kernel, which is
        # faster still (~100M model: 27 vs 38 ms a step); it may round differently in the last
        # bits from the same row decoded among others.
        parts = [jnp.einsum("rd,fd->rf", x_RD, block_FD, preferred_element_type=acc) for block_FD in w]
    else:
        # A decode step's few rows. XLA:CPU streams the weights about twice as fast when they
        # are the dot's left operand and its output is [out, rows] (8 rows x 768 -> 4096, 24
        # such matrices, f32: 29 ms against 52 ms). Its kernel rounds a row differently by how
        # many rows share the call, so every call sees panels of exactly _ROW_PANEL rows (zero
        # padded): a row's logits then do not depend on the batch size (2 to 32 rows), by
        # construction (what splitting episodes over hosts relies on). The barrier keeps XLA
        # from folding the small transpose back into the dot.
        padded = -(-rows // _ROW_PANEL) * _ROW_PANEL
        x_RD = jnp.pad(x_RD, ((0, padded - rows), (0, 0)))

        def panel(block_FD, i):  # barrier per panel: XLA would otherwise merge the dots
            out_FP = jnp.einsum("fd,pd->fp", block_FD, x_RD[i:i + _ROW_PANEL], preferred_element_type=acc)
            return jax.lax.optimization_barrier(out_FP).T

        parts = [jnp.concatenate([panel(block_FD, i) for i in range(0, padded, _ROW_PANEL)])[:rows]
                 for block_FD in w]
    out_RF = parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=-1)
    return out_RF.reshape(*lead, out_RF.shape[-1])


def _projector(config: Qwen3Config, dtype):
    """`project` of `qwen3.decoder_layer` over decode-layout weights: one dot per fused group."""
    splits = {qwen3.QKV: [config.q_dim, config.q_dim + config.kv_dim], qwen3.GATE_UP: 2}

    def project(lp, group, h):
        out = _matmul(h, lp[_FUSED[group]], dtype).astype(dtype)
        return jnp.split(out, splits[group], axis=-1) if group in splits else [out]

    return project


# ----------------------------------------------------------------------------- per-layer cache

# A bf16 cache is stored as its bits (uint16; `kv_values` reads it): XLA:CPU has no bf16
# scatter, and bitcasting a bf16 buffer to write it copies the buffer (a bf16 decode step of the
# ~100M benchmark model: 16 copies of 1 MB, about 2 ms).


def empty_cache(config: Qwen3Config, batch: int, max_len: int, dtype="bfloat16") -> qwen3.KVCache:
    """An empty cache whose k and v are tuples of per-layer [B, G, S, K] buffers (each read and
    written in place), bf16 stored as its bits."""
    shape = (batch, config.num_kv_heads, max_len, config.head_dim)
    dtype = jnp.uint16 if jnp.dtype(dtype) == jnp.bfloat16 else dtype
    return qwen3.KVCache(k=tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)),
                         v=tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)),
                         segment_ids=jnp.zeros((batch, max_len), jnp.int32),
                         lengths=jnp.zeros((batch,), jnp.int32))


def _scatter_kv(buf_BGSK, new_BTGK, slots_BT):
    """Writes new keys or values into one layer's buffer (a bf16 cache's bits)."""
    if buf_BGSK.dtype == jnp.uint16:  # a bf16 cache's bits
        new = lax.bitcast_convert_type(new_BTGK.astype(jnp.bfloat16), jnp.uint16)
    else:
        new = new_BTGK.astype(buf_BGSK.dtype)
    b = jnp.arange(slots_BT.shape[0])[:, None]
    return buf_BGSK.at[b, slice(None), slots_BT].set(new, mode="drop")


def kv_values(buf):
    """A cache buffer's keys or values in the cache's dtype (bf16 from its stored bits)."""
    return lax.bitcast_convert_type(buf, jnp.bfloat16) if buf.dtype == jnp.uint16 else buf


def cache_mask(cache_segment_BS, lengths_B, t: int):
    """mask_BTS of t new tokens (written at slots lengths[b] + i) over a cache buffer that
    already holds them: every filled slot up to the query's own."""
    query_slot_BT = lengths_B[:, None] + jnp.arange(t, dtype=lengths_B.dtype)[None]
    slot_S = jnp.arange(cache_segment_BS.shape[1], dtype=lengths_B.dtype)
    return (cache_segment_BS != 0)[:, None, :] & (slot_S[None, None, :] <= query_slot_BT[:, :, None])


@functools.partial(jax.named_call, name="cache_attention")
def cache_attention(q_BTHK, k_BGSK, v_BGSK, mask_BTS):
    """GQA attention of new tokens over a cache buffer [B, G, S, K] that already holds them
    (read as it lies: batch axes leading, no transposed copy); scores and softmax in f32."""
    acc = qwen3.acc_dtype(q_BTHK.dtype)
    q = attention.grouped_queries(q_BTHK, k_BGSK.shape[1])
    if q.shape[2] == 1:  # one new token (a decode step): see _one_query_attention
        return _one_query_attention(q[:, :, 0], k_BGSK, v_BGSK, mask_BTS[:, 0]).reshape(q_BTHK.shape)
    scores = jnp.einsum("bgtrd,bgsd->bgtrs", q, k_BGSK, preferred_element_type=acc)
    scores = jnp.where(mask_BTS[:, None, :, None, :], scores, attention.MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_BGSK.dtype)
    out = jnp.einsum("bgtrs,bgsd->bgtrd", probs, v_BGSK, preferred_element_type=acc)
    return out.transpose(0, 2, 1, 3, 4).reshape(q_BTHK.shape).astype(q_BTHK.dtype)


def _one_query_attention(q_BGRK, k_BGSK, v_BGSK, mask_BS):
    """cache_attention of a single query position, as one batched matrix-vector product per
    query head of a group instead of one batched matrix product: XLA:CPU emits matrix-vector
    products inline, while each small batched matrix product is a library call per batch
    element (measured, ~100M model at batch 8, window 256: decode step 42 -> 36 ms).
    Returns out_BGRK in q's dtype."""
    acc = qwen3.acc_dtype(q_BGRK.dtype)
    heads = range(q_BGRK.shape[2])
    scores_BGRS = jnp.stack([jnp.einsum("bgsd,bgd->bgs", k_BGSK, q_BGRK[:, :, r], preferred_element_type=acc)
                             for r in heads], axis=2)
    scores_BGRS = jnp.where(mask_BS[:, None, None, :], scores_BGRS, attention.MASKED)
    probs_BGRS = jax.nn.softmax(scores_BGRS, axis=-1).astype(v_BGSK.dtype)
    out_BGRK = jnp.stack([jnp.einsum("bgs,bgsd->bgd", probs_BGRS[:, :, r], v_BGSK, preferred_element_type=acc)
                          for r in heads], axis=2)
    return out_BGRK.astype(q_BGRK.dtype)


def hidden_states(params: dict, config: Qwen3Config, tokens_BT, *, positions_BT=None, segment_ids_BT=None,
                  cache: qwen3.KVCache | None = None, window: int | None = None):
    """`qwen3.hidden_states` over decode-layout weights and a per-layer cache (`empty_cache`),
    unrolled. `window` (static): attend over the first `window` slots, which must hold every
    row's tokens including the new ones (the caller buckets it), instead of the whole capacity;
    a decode step then reads the filled part of the cache only."""
    c = config
    b, t = tokens_BT.shape
    dt = jnp.dtype(c.compute_dtype)
    if segment_ids_BT is None:
        segment_ids_BT = jnp.ones((b, t), jnp.int32)
    segment_ids_BT = segment_ids_BT.astype(jnp.int32)
    if cache is None:
        if positions_BT is None:
            positions_BT = qwen3.segment_positions(segment_ids_BT)
        attend_sequence = qwen3.sequence_attention(c, segment_ids_BT)

        def attend(q, k, v, cache_kv):
            return attend_sequence(q, k, v), None
    else:
        if positions_BT is None:
            positions_BT = cache.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
        slots = qwen3.cache_slots(segment_ids_BT, cache.lengths, cache.segment_ids.shape[1])
        segments = qwen3.scatter_rows(cache.segment_ids, segment_ids_BT, slots)
        lengths = cache.lengths + jnp.sum(segment_ids_BT != 0, axis=1).astype(jnp.int32)
        # Write first, then attend over the buffer as it now is: the buffer flows from input
        # to output through one in-place scatter, so XLA need not copy it.
        w = segments.shape[1] if window is None else min(window, segments.shape[1])
        mask = cache_mask(segments[:, :w], cache.lengths, t)

        def attend(q, k, v, cache_kv):
            ck, cv = (_scatter_kv(buf, new, slots) for buf, new in zip(cache_kv, (k, v)))
            seen = [kv_values(lax.slice_in_dim(x, 0, w, axis=2)).astype(dt) for x in (ck, cv)]
            return cache_attention(q, *seen, mask), (ck, cv)

    cos, sin = qwen3.rope_tables(positions_BT, c.head_dim, c.rope_theta)
    x = embed_rows(params["embed"], tokens_BT).astype(dt)
    project = _projector(c, dt)

    def layer(x, xs):
        lp, cache_kv = xs
        return qwen3.decoder_layer(c, x, lp, cos, sin, lambda q, k, v: attend(q, k, v, cache_kv), project)

    layer = qwen3.remat(layer, c)
    outs = []
    for i, lp in enumerate(params["layers"]):
        x, out = layer(x, (lp, None if cache is None else (cache.k[i], cache.v[i])))
        outs.append(out)
    h = qwen3.rms_norm(x, params["final_norm"], c.rms_norm_eps)
    if cache is None:
        return h
    k, v = tuple(zip(*outs))  # the written buffers
    return h, qwen3.KVCache(k=k, v=v, segment_ids=segments, lengths=lengths)


def unembed(params: dict, config: Qwen3Config, h_BTD):
    """Logits in f32 from hidden states, through decode-layout `lm_head` blocks (tied or not)."""
    if config.is_embedding:
        raise ValueError("an embedding model (is_embedding=True) has no language-model head")
    return _matmul(h_BTD, params["lm_head"], jnp.dtype(config.compute_dtype))


def forward(params: dict, config: Qwen3Config, tokens_BT, **kwargs):
    """Logits (and the new cache, when one is given) over decode-layout weights."""
    out = hidden_states(params, config, tokens_BT, **kwargs)
    if kwargs.get("cache") is None:
        return unembed(params, config, out)
    return unembed(params, config, out[0]), out[1]


# ----------------------------------------------------------------------------- the backend


@dataclasses.dataclass(frozen=True)
class CPU:
    """The CPU backend: decodes over the per-layer layout in `column_blocks` blocks, attending
    over a bucketed window of the cache; trains with `KERNELS`. Hashable (a program key)."""

    column_blocks: int = 1
    name = "cpu"
    layout = "per_layer"
    kv_cache = "contiguous"  # the paged cache is the stacked layout's (`backends.accelerator`)
    windowed = True  # a call attends over the bucketed filled prefix of the cache, not all of it

    def with_attention(self, config: Qwen3Config) -> Qwen3Config:
        """The config with "auto" attention resolved: the XLA kernel (the only one on CPU)."""
        return config.replace(attention_impl="xla") if config.attention_impl == "auto" else config

    def with_kernels(self, config: Qwen3Config) -> Qwen3Config:
        return self.with_attention(config).replace(kernels=KERNELS)

    def compiler_options(self):
        return compiler_options()

    def prepare(self, params: dict, config: Qwen3Config) -> dict:
        return params if is_prepared(params) else decode_layout(params, config, self.column_blocks)

    def is_prepared(self, params: dict) -> bool:
        return is_prepared(params)

    def empty_cache(self, config: Qwen3Config, batch: int, max_len: int, dtype) -> qwen3.KVCache:
        return empty_cache(config, batch, max_len, dtype)

    def kv_sharding(self, config: Qwen3Config, mesh, rules):
        return (rules.sharding(mesh, ("batch", "cache_heads", "cache_seq", "head_dim")),) * config.num_layers

    def hidden_states(self, params, config, tokens_BT, *, segment_ids_BT, cache, window):
        return hidden_states(params, config, tokens_BT, segment_ids_BT=segment_ids_BT, cache=cache, window=window)

    def unembed(self, params, config, h_BTD):
        return unembed(params, config, h_BTD)
