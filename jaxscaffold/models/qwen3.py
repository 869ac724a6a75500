"""The Qwen3 dense decoder as pure functions over a parameter pytree.

Parameters are a nested dict of arrays. Per-layer weights are stacked along a leading
`layers` axis, so the same pytree serves an unrolled Python loop and `lax.scan` (whose
compile time does not grow with depth). Projection weights are stored `[in, out]` with the
heads fused into one axis (`q: [L, D, H*K]`), so each is a plain transpose of the Hugging
Face `[out, in]` tensor; sharding the fused axis over `tensor` splits whole heads whenever
the tensor size divides the head count.

Entry points:
  forward(params, config, tokens_BT, ...) -> logits_BTV            (and the cache, if given)
  hidden_states(params, config, tokens_BT, ...) -> final-normed h_BTD (and the cache)
  unembed(params, config, h_BTD) -> logits_BTV
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxscaffold.models import attention
from jaxscaffold.models.config import Qwen3Config
from jaxscaffold.models.sharding import DEFAULT_RULES, ShardingRules, tree_shardings

# ----------------------------------------------------------------------------- parameters


def param_logical_axes(config: Qwen3Config) -> dict:
    """Logical axis names of every parameter (same tree structure as the parameters)."""
    layer = {
        "attn_norm": ("layers", "norm"),
        "q": ("layers", "embed", "q_heads"),
        "k": ("layers", "embed", "kv_heads"),
        "v": ("layers", "embed", "kv_heads"),
        "o": ("layers", "q_heads", "embed"),
        "q_norm": ("layers", "head_dim"),
        "k_norm": ("layers", "head_dim"),
        "mlp_norm": ("layers", "norm"),
        "gate": ("layers", "embed", "mlp"),
        "up": ("layers", "embed", "mlp"),
        "down": ("layers", "mlp", "embed"),
    }
    axes = {"embed": ("vocab", "embed"), "layers": layer, "final_norm": ("norm",)}
    if config.has_lm_head:
        axes["lm_head"] = ("embed", "vocab")
    return axes


def param_shapes(config: Qwen3Config) -> dict:
    """`jax.ShapeDtypeStruct` of every parameter, in `config.param_dtype`."""
    c, n = config, config.num_layers
    d, f, k = c.hidden_size, c.intermediate_size, c.head_dim
    shapes = {
        "embed": (c.vocab_size, d),
        "layers": {
            "attn_norm": (n, d), "q": (n, d, c.q_dim), "k": (n, d, c.kv_dim), "v": (n, d, c.kv_dim),
            "o": (n, c.q_dim, d), "q_norm": (n, k), "k_norm": (n, k), "mlp_norm": (n, d),
            "gate": (n, d, f), "up": (n, d, f), "down": (n, f, d),
        },
        "final_norm": (d,),
    }
    if c.has_lm_head:
        shapes["lm_head"] = (d, c.vocab_size)
    dtype = jnp.dtype(c.param_dtype)
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, dtype), shapes,
                        is_leaf=lambda x: isinstance(x, tuple))


def param_shardings(config: Qwen3Config, mesh, rules: ShardingRules = DEFAULT_RULES) -> dict:
    """NamedSharding of every parameter on `mesh` under `rules`."""
    return tree_shardings(mesh, param_logical_axes(config), rules)


def init_params(config: Qwen3Config, key: jax.Array, mesh=None,
                rules: ShardingRules = DEFAULT_RULES) -> dict:
    """Random parameters (normal(0, 0.02) matrices, unit norms), created already sharded."""
    out_shardings = None if mesh is None else param_shardings(config, mesh, rules)
    # One module-level function (config static): later calls reuse the compiled program.
    return jax.jit(_random_params, static_argnums=0, out_shardings=out_shardings)(config, key)


def _random_params(config: Qwen3Config, key: jax.Array) -> dict:
    shapes = param_shapes(config)
    leaves, treedef = jax.tree.flatten(shapes)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(shapes)[0]]
    keys = jax.random.split(key, len(leaves))
    out = []
    for k, s, path in zip(keys, leaves, paths):
        if "norm" in path:
            out.append(jnp.ones(s.shape, s.dtype))
        else:
            out.append((0.02 * jax.random.normal(k, s.shape, jnp.float32)).astype(s.dtype))
    return jax.tree.unflatten(treedef, out)


def is_stacked(params: dict) -> bool:
    """Whether per-layer weights are stacked on a leading axis (else a tuple of dicts)."""
    return not isinstance(params["layers"], (tuple, list))


_MATRICES = ("q", "k", "v", "o", "gate", "up", "down")


def decode_layout(params: dict, config: Qwen3Config, blocks: int = 1) -> dict:
    """The same weights laid out for fast small-batch decoding on CPU.

    `layers` becomes a tuple of per-layer dicts with q/k/v fused into `qkv` and gate/up into
    `gate_up`, and every matrix (and the unembedding, as `lm_head`) a tuple of `blocks`
    blocks of its transpose, [out / blocks, in] each. Why, on
    XLA:CPU at batch 8 (the ~100M benchmark model): a layer's slice of stacked weights is
    copied before each matmul (under scan or a static index), doubling the memory traffic;
    [out, in] weights are read about 1.2x (f32) to 1.8x (bf16) faster than [in, out]; and
    one small-batch dot runs on one core while independent dots run on different cores, so
    blocks put every core to work. Forward passes accept either layout.
    """
    if not is_stacked(params):
        return params

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


# ----------------------------------------------------------------------------- KV cache


class KVCache(NamedTuple):
    """Per-layer keys/values of earlier tokens. Row b holds `lengths[b]` valid tokens in
    slots [0, lengths[b]); new tokens are written at slot lengths[b] + t. Heads come before
    slots so attention reads the cache as it lies (batch axes leading: no transpose).

    A bf16 cache is stored as its bits (uint16; `kv_values` reads it): XLA:CPU has no bf16
    scatter, and bitcasting a bf16 buffer to write it copies the buffer (a bf16 decode step
    of the ~100M benchmark model: 16 copies of 1 MB, about 2 ms)."""

    k: jax.Array  # [L, B, G, S, K], or a tuple of L [B, G, S, K] buffers (per_layer)
    v: jax.Array  # same as k
    segment_ids: jax.Array  # [B, S] int32, 0 = empty / padding slot
    lengths: jax.Array  # [B] int32

    @staticmethod
    def empty(config: Qwen3Config, batch: int, max_len: int, dtype="bfloat16",
              per_layer: bool = False) -> "KVCache":
        """An empty cache; `per_layer` gives k and v as tuples of [B, G, S, K] buffers (the
        layout that goes with `decode_layout`: each layer's buffer is read and written in
        place)."""
        shape = (config.num_layers, batch, config.num_kv_heads, max_len, config.head_dim)
        dtype = jnp.uint16 if jnp.dtype(dtype) == jnp.bfloat16 else dtype  # bf16: its bits
        if per_layer:
            k = tuple(jnp.zeros(shape[1:], dtype) for _ in range(shape[0]))
            v = tuple(jnp.zeros(shape[1:], dtype) for _ in range(shape[0]))
        else:
            k, v = jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)
        return KVCache(
            k=k, v=v,
            segment_ids=jnp.zeros((batch, max_len), jnp.int32),
            lengths=jnp.zeros((batch,), jnp.int32),
        )


def cache_slots(segment_ids_BT, lengths_B, capacity: int):
    """Cache slot of each new token: lengths[b] + t for real tokens; `capacity` (out of
    range, so the write is dropped) for padding. Rows must be right-padded."""
    t = segment_ids_BT.shape[1]
    slots = lengths_B[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
    return jnp.where(segment_ids_BT != 0, slots, capacity)


def _scatter_rows(buf_BS, new_BT, slots_BT):
    """buf[b, slots[b, t]] = new[b, t]; out-of-range slots are dropped, so padding never
    overwrites a cached token, even in a full row. In place when `buf` is donated."""
    b = jnp.arange(slots_BT.shape[0])[:, None]
    return buf_BS.at[b, slots_BT].set(new_BT.astype(buf_BS.dtype), mode="drop")


def _embed_rows(embed_VD, tokens_BT):
    """embed[tokens]; 16-bit tables are gathered as their bits (XLA:CPU would otherwise
    convert the whole table to f32 for every call)."""
    if embed_VD.dtype.itemsize != 2:
        return jnp.take(embed_VD, tokens_BT, axis=0)
    rows = jnp.take(lax.bitcast_convert_type(embed_VD, jnp.uint16), tokens_BT, axis=0)
    return lax.bitcast_convert_type(rows, embed_VD.dtype)


def _scatter_kv(buf, new_BTGK, slots_BT):
    """Writes new keys or values [(L,) B, T, G, K] into a cache buffer [(L,) B, G, S, K]
    (a bf16 cache's bits: see KVCache)."""
    if buf.dtype == jnp.uint16:  # a bf16 cache's bits
        new = lax.bitcast_convert_type(new_BTGK.astype(jnp.bfloat16), jnp.uint16)
    else:
        new = new_BTGK.astype(buf.dtype)
    if buf.ndim == 5:  # stacked layers; advanced indices (b, slots) lead the indexed shape
        new = jnp.moveaxis(new, 0, 2)
    b = jnp.arange(slots_BT.shape[0])[:, None]
    index = (slice(None), b, slice(None), slots_BT) if buf.ndim == 5 else (b, slice(None), slots_BT)
    return buf.at[index].set(new, mode="drop")


def kv_values(buf):
    """A cache buffer's keys or values in the cache's dtype (bf16 from its stored bits)."""
    return lax.bitcast_convert_type(buf, jnp.bfloat16) if buf.dtype == jnp.uint16 else buf


# ----------------------------------------------------------------------------- layers


def _acc(dtype):
    """Accumulation dtype: f32 for f32 / bf16 compute, f64 when computing in f64 (tests)."""
    return jnp.promote_types(dtype, jnp.float32)


def rms_norm(x, weight, eps: float):
    """RMSNorm in (at least) f32, returned in x's dtype."""
    x32 = x.astype(_acc(x.dtype))
    normed = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (normed * weight.astype(x32.dtype)).astype(x.dtype)


def rope_tables(positions_BT, head_dim: int, theta: float):
    """cos/sin tables [B, T, K] of half-split rotary embeddings (computed in f32)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = positions_BT.astype(jnp.float32)[..., None] * inv_freq
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x_BTHK, cos_BTK, sin_BTK):
    half = x_BTHK.shape[-1] // 2
    rotated = jnp.concatenate([-x_BTHK[..., half:], x_BTHK[..., :half]], axis=-1)
    x32 = x_BTHK.astype(_acc(x_BTHK.dtype))
    out = x32 * cos_BTK[:, :, None] + rotated.astype(x32.dtype) * sin_BTK[:, :, None]
    return out.astype(x_BTHK.dtype)


_FEW_ROWS = 32  # from 2 to this many rows, `decode_layout` matmuls run in row panels, out-major
_ROW_PANEL = 8  # rows per panel


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _dense(x, w_DF, acc_dtype):
    """x @ w_DF accumulated in `acc_dtype`: autodiff's own product, with the weight gradient
    taken as x^T @ dy, x^T materialised (the smaller operand). Left to itself, XLA:CPU
    transposes dy instead, in a strided loop fused into dy's producer, and contracts the
    token axis of x in place: an MLP block's forward + backward, [8, 256, 768] -> 2048,
    568 ms against 429 ms this way (PyTorch: 537 ms)."""
    return jnp.einsum("...d,df->...f", x, w_DF, preferred_element_type=acc_dtype)


def _dense_fwd(x, w_DF, acc_dtype):
    return _dense(x, w_DF, acc_dtype), (x, w_DF)


def _dense_bwd(acc_dtype, residuals, dy):
    x, w_DF = residuals
    dx = jnp.einsum("...f,df->...d", dy, w_DF, preferred_element_type=acc_dtype).astype(x.dtype)
    x_DN = lax.optimization_barrier(x.reshape(-1, x.shape[-1]).T)  # barrier: XLA would fold it back
    dw = jnp.einsum("dn,nf->df", x_DN, dy.reshape(-1, dy.shape[-1]), preferred_element_type=acc_dtype)
    return dx, dw.astype(w_DF.dtype)


_dense.defvjp(_dense_fwd, _dense_bwd)


def _matmul(x, w, dtype):
    """x @ w with inputs in `dtype`, accumulated and returned in (at least) f32. `w` is
    [in, out], or a tuple of [out_block, in] blocks of its transpose (`decode_layout`)."""
    acc = _acc(dtype)
    if not isinstance(w, tuple):
        # The custom VJP where it was measured to help (XLA:CPU); on TPU and GPU autodiff's own
        # form (not measured there).
        if jax.default_backend() == "cpu":
            return _dense(x.astype(dtype), w.astype(dtype), acc)
        return jnp.einsum("...d,df->...f", x.astype(dtype), w.astype(dtype), preferred_element_type=acc)
    lead, rows = x.shape[:-1], math.prod(x.shape[:-1])
    x_RD = x.reshape(rows, x.shape[-1]).astype(dtype)
    w = tuple(block_FD.astype(dtype) for block_FD in w)  # once per block, not per panel
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


def _dot(x, w, dtype):
    """x @ w in `dtype` with f32 accumulation (several times faster than pure bf16 on CPU)."""
    return _matmul(x, w, dtype).astype(dtype)


def _decoder_layer(config: Qwen3Config, x_BTD, lp, cos, sin, attend):
    """One pre-norm decoder block. `attend(q, k, v) -> (attn, kv_out)` is the attention of
    the caller's setting (no cache, a read-only stacked cache, or a per-layer cache that it
    writes first) and `kv_out` what that setting hands back."""
    c, dt = config, jnp.dtype(config.compute_dtype)
    b, t, _ = x_BTD.shape
    h = rms_norm(x_BTD, lp["attn_norm"], c.rms_norm_eps)
    if "qkv" in lp:  # decode_layout
        q, k, v = jnp.split(_dot(h, lp["qkv"], dt), [c.q_dim, c.q_dim + c.kv_dim], axis=-1)
    else:
        q, k, v = _dot(h, lp["q"], dt), _dot(h, lp["k"], dt), _dot(h, lp["v"], dt)
    q = q.reshape(b, t, c.num_heads, c.head_dim)
    k = k.reshape(b, t, c.num_kv_heads, c.head_dim)
    v = v.reshape(b, t, c.num_kv_heads, c.head_dim)
    q = apply_rope(rms_norm(q, lp["q_norm"], c.rms_norm_eps), cos, sin)
    k = apply_rope(rms_norm(k, lp["k_norm"], c.rms_norm_eps), cos, sin)
    attn, kv_out = attend(q, k, v)
    x_BTD = x_BTD + _dot(attn.reshape(b, t, c.q_dim), lp["o"], dt)
    h = rms_norm(x_BTD, lp["mlp_norm"], c.rms_norm_eps)
    if "gate_up" in lp:
        gate, up = jnp.split(_dot(h, lp["gate_up"], dt), 2, axis=-1)
    else:
        gate, up = _dot(h, lp["gate"], dt), _dot(h, lp["up"], dt)
    mlp = jax.nn.silu(gate) * up
    x_BTD = x_BTD + _dot(mlp, lp["down"], dt)
    return x_BTD, kv_out


_REMAT_POLICIES = {
    "full": None,  # save nothing: recompute the whole layer in the backward pass
    "save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def segment_positions(segment_ids_BT):
    """Position of each token within its (contiguous) segment: restarts at every change of
    segment id, so the first real token of a left-padded row gets position 0."""
    t = segment_ids_BT.shape[1]
    index = jnp.arange(t, dtype=jnp.int32)
    changed = jnp.concatenate(
        [jnp.ones_like(segment_ids_BT[:, :1], bool), segment_ids_BT[:, 1:] != segment_ids_BT[:, :-1]], axis=1)
    starts = lax.cummax(jnp.where(changed, index[None], 0), axis=1)
    return index[None] - starts


def hidden_states(params: dict, config: Qwen3Config, tokens_BT, *, positions_BT=None,
                  segment_ids_BT=None, cache: KVCache | None = None, window: int | None = None):
    """The final-normed hidden states h_BTD (the embedding model's output).

    Args:
      tokens_BT: int token ids.
      positions_BT: RoPE positions. Default: the index within the segment (no cache), or
        continuing from the cache length.
      segment_ids_BT: 0 = padding, otherwise a segment id (packed rows attend only within a
        segment). Default: all ones.
      cache: a KVCache; the new tokens (right-padded) are written after each row's length;
        padding is never written, and tokens past the capacity are dropped.
      window: per-layer caches only (static): attend over the first `window` slots, which
        must hold every row's tokens including the new ones (the caller buckets it), instead
        of the whole capacity; a decode step then reads the filled part of the cache only.

    Returns:
      h_BTD, or (h_BTD, new_cache) when a cache is given.
    """
    c = config
    b, t = tokens_BT.shape
    dt = jnp.dtype(c.compute_dtype)
    if segment_ids_BT is None:
        segment_ids_BT = jnp.ones((b, t), jnp.int32)
    segment_ids_BT = segment_ids_BT.astype(jnp.int32)
    impl = attention.resolve_impl(c.attention_impl, c.compute_dtype)
    per_layer_cache = cache is not None and isinstance(cache.k, tuple)
    if cache is None:
        if positions_BT is None:
            positions_BT = segment_positions(segment_ids_BT)
        index = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        mask_args = dict(q_segment_BT=segment_ids_BT, kv_segment_BS=segment_ids_BT,
                         q_index_BT=index, kv_index_S=jnp.arange(t, dtype=jnp.int32))

        def attend(q, k, v, cache_kv):
            return attention.attend(impl, q, k, v, **mask_args), None
    else:
        if positions_BT is None:
            positions_BT = cache.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
        slots = cache_slots(segment_ids_BT, cache.lengths, cache.segment_ids.shape[1])
        segments = _scatter_rows(cache.segment_ids, segment_ids_BT, slots)
        lengths = cache.lengths + jnp.sum(segment_ids_BT != 0, axis=1).astype(jnp.int32)
        if per_layer_cache:
            # Write first, then attend over the buffer as it now is: the buffer flows from
            # input to output through one in-place scatter, so XLA need not copy it.
            w = segments.shape[1] if window is None else min(window, segments.shape[1])
            mask = attention.cache_mask(segments[:, :w], cache.lengths, t)

            def attend(q, k, v, cache_kv):
                ck, cv = (_scatter_kv(buf, new, slots) for buf, new in zip(cache_kv, (k, v)))
                seen = [kv_values(lax.slice_in_dim(x, 0, w, axis=2)).astype(dt) for x in (ck, cv)]
                return attention.cache_attention(q, *seen, mask), (ck, cv)
        else:
            # Stacked: the cache is read only here and written once after all layers (a
            # scan writing it per layer would copy the whole cache every call).
            def attend(q, k, v, cache_kv):
                ck, cv = cache_kv
                return attention.cached_attention(q, kv_values(ck).astype(dt), kv_values(cv).astype(dt), k, v,
                                                  cache_segment_BS=cache.segment_ids,
                                                  segment_BT=segment_ids_BT), (k, v)

    cos, sin = rope_tables(positions_BT, c.head_dim, c.rope_theta)
    x = _embed_rows(params["embed"], tokens_BT).astype(dt)

    def layer(x, xs):
        lp, cache_kv = xs
        return _decoder_layer(c, x, lp, cos, sin, lambda q, k, v: attend(q, k, v, cache_kv))

    if c.remat_policy != "none":
        layer = jax.checkpoint(layer, policy=_REMAT_POLICIES[c.remat_policy])

    layers = params["layers"]
    if is_stacked(params) and c.scan_layers and not per_layer_cache:
        x, kv_out = lax.scan(layer, x, (layers, None if cache is None else (cache.k, cache.v)))
    else:
        # Unrolled. With stacked weights the static slices are copies on CPU (about 3x a
        # decode step's memory traffic): `decode_layout` weights avoid them.
        outs = []
        for i in range(c.num_layers):
            lp = layers[i] if not is_stacked(params) else jax.tree.map(lambda a: a[i], layers)
            x, out = layer(x, (lp, None if cache is None else (cache.k[i], cache.v[i])))
            outs.append(out)
        kv_out = None if cache is None else (
            tuple(zip(*outs)) if per_layer_cache else jax.tree.map(lambda *a: jnp.stack(a), *outs))

    h = rms_norm(x, params["final_norm"], c.rms_norm_eps)
    if cache is None:
        return h
    if per_layer_cache:
        k, v = kv_out  # the written buffers
    else:  # every layer's new keys/values in one scatter; padding and overflow are dropped
        k, v = _scatter_kv(cache.k, kv_out[0], slots), _scatter_kv(cache.v, kv_out[1], slots)
    return h, KVCache(k=k, v=v, segment_ids=segments, lengths=lengths)


def unembed(params: dict, config: Qwen3Config, h_BTD):
    """Logits in f32 from hidden states (tied embedding or the separate lm_head)."""
    if config.is_embedding:
        raise ValueError("an embedding model (is_embedding=True) has no language-model head")
    dt = jnp.dtype(config.compute_dtype)
    if isinstance(params.get("lm_head"), tuple):  # decode_layout's blocks, tied or not
        return _matmul(h_BTD, params["lm_head"], dt)
    if config.tie_word_embeddings:
        w = params["embed"]
        return jnp.einsum("btd,vd->btv", h_BTD.astype(dt), w.astype(dt),
                          preferred_element_type=_acc(dt))
    return jnp.einsum("btd,dv->btv", h_BTD.astype(dt), params["lm_head"].astype(dt),
                      preferred_element_type=_acc(dt))


def forward(params: dict, config: Qwen3Config, tokens_BT, *, positions_BT=None,
            segment_ids_BT=None, cache: KVCache | None = None, window: int | None = None):
    """Logits_BTV (f32) of a Qwen3 causal LM; `(logits_BTV, new_cache)` when a cache is given.

    See `hidden_states` for the optional arguments. Jit it with `config` static, e.g.
    `jax.jit(forward, static_argnums=1)`.
    """
    out = hidden_states(params, config, tokens_BT, positions_BT=positions_BT,
                        segment_ids_BT=segment_ids_BT, cache=cache, window=window)
    if cache is None:
        return unembed(params, config, out)
    h, new_cache = out
    return unembed(params, config, h), new_cache
