"""The Qwen3 dense decoder as pure functions over a parameter pytree (Qwen2.5 too: the
config's `model_type` "qwen2" adds q/k/v biases and drops the q/k norms).

Parameters are a nested dict of arrays. Per-layer weights are stacked along a leading
`layers` axis, so the same pytree serves an unrolled Python loop and `lax.scan` (whose
compile time does not grow with depth). Projection weights are stored `[in, out]` with the
heads fused into one axis (`q: [L, D, H*K]`), so each is a plain transpose of the Hugging
Face `[out, in]` tensor; sharding the fused axis over `tensor` splits whole heads whenever
the tensor size divides the head count.

The model is the same on every platform: what a platform does its own way (the CPU's decode
layout, its dense layers' gradient) lives in `jaxscaffold.backends`, which composes these
pieces (`decoder_layer`, `rope_tables`, ...) and passes its kernels in `config.kernels`.

Entry points:
  forward(params, config, tokens_BT, ...) -> logits_BTV            (and the cache, if given)
  hidden_states(params, config, tokens_BT, ...) -> final-normed h_BTD (and the cache)
  unembed(params, config, h_BTD) -> logits_BTV
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxscaffold.models import attention, paged_attention
from jaxscaffold.models.config import Qwen3Config
from jaxscaffold.models.sharding import DEFAULT_RULES, ShardingRules, tree_shardings

# ----------------------------------------------------------------------------- parameters


def layer_param_names(config: Qwen3Config) -> tuple[str, ...]:
    """Names of a layer's parameters: Qwen3's q/k norms, or Qwen2's q/k/v biases."""
    names = ("attn_norm", "q", "k", "v", "o")
    names += ("q_norm", "k_norm") if config.qk_norm else ()
    names += ("q_bias", "k_bias", "v_bias") if config.qkv_bias else ()
    return names + ("mlp_norm", "gate", "up", "down")


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
        "q_bias": ("layers", "q_heads"),
        "k_bias": ("layers", "kv_heads"),
        "v_bias": ("layers", "kv_heads"),
        "mlp_norm": ("layers", "norm"),
        "gate": ("layers", "embed", "mlp"),
        "up": ("layers", "embed", "mlp"),
        "down": ("layers", "mlp", "embed"),
    }
    layer = {name: layer[name] for name in layer_param_names(config)}
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
            "q_bias": (n, c.q_dim), "k_bias": (n, c.kv_dim), "v_bias": (n, c.kv_dim),
        },
        "final_norm": (d,),
    }
    shapes["layers"] = {name: shapes["layers"][name] for name in layer_param_names(c)}
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
    """Random parameters (normal(0, 0.02) matrices and biases, unit norms), created already
    sharded."""
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


# ----------------------------------------------------------------------------- KV cache


class KVCache(NamedTuple):
    """Per-layer keys/values of earlier tokens. Row b holds `lengths[b]` valid tokens in
    slots [0, lengths[b]); new tokens are written at slot lengths[b] + t. Heads come before
    slots so attention reads the cache as it lies (batch axes leading: no transpose). The
    model's cache is stacked over layers; a backend may hold its own form (`backends.cpu`:
    a tuple of per-layer buffers)."""

    k: jax.Array  # [L, B, G, S, K]
    v: jax.Array  # same as k
    segment_ids: jax.Array  # [B, S] int32, 0 = empty / padding slot
    lengths: jax.Array  # [B] int32

    @staticmethod
    def empty(config: Qwen3Config, batch: int, max_len: int, dtype="bfloat16") -> "KVCache":
        """An empty stacked cache in `dtype`."""
        shape = (config.num_layers, batch, config.num_kv_heads, max_len, config.head_dim)
        return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
                       segment_ids=jnp.zeros((batch, max_len), jnp.int32),
                       lengths=jnp.zeros((batch,), jnp.int32))


class PagedKVCache(NamedTuple):
    """Keys/values in pages (`models.paged_attention`): one pool a layer, stacked, and a page
    table a row. Row b's token at position p lies in page `table[b, p // page]`, at slot
    `p % page`. The sampler allocates the pages on the host (`rollout.engine`); page 0 is
    scratch: the table entries a row has not filled point there, and are masked when read."""

    k: jax.Array  # [L, G, P, page, K]
    v: jax.Array  # same as k
    table: jax.Array  # [B, N] int32 page ids, N = ceil(max_len / page)
    lengths: jax.Array  # [B] int32

    @staticmethod
    def empty(config: Qwen3Config, batch: int, max_len: int, *, pages: int, page_size: int,
              dtype="bfloat16") -> "PagedKVCache":
        """An empty pool of `pages` pages of `page_size` tokens (page 0 the scratch page)."""
        shape = (config.num_layers, config.num_kv_heads, pages, page_size, config.head_dim)
        return PagedKVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
                            table=jnp.zeros((batch, -(-max_len // page_size)), jnp.int32),
                            lengths=jnp.zeros((batch,), jnp.int32))


def cache_slots(segment_ids_BT, lengths_B, capacity: int):
    """Cache slot of each new token: lengths[b] + t for real tokens; `capacity` (out of
    range, so the write is dropped) for padding. Rows must be right-padded."""
    t = segment_ids_BT.shape[1]
    slots = lengths_B[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
    return jnp.where(segment_ids_BT != 0, slots, capacity)


def scatter_rows(buf_BS, new_BT, slots_BT):
    """buf[b, slots[b, t]] = new[b, t]; out-of-range slots are dropped, so padding never
    overwrites a cached token, even in a full row. In place when `buf` is donated."""
    b = jnp.arange(slots_BT.shape[0])[:, None]
    return buf_BS.at[b, slots_BT].set(new_BT.astype(buf_BS.dtype), mode="drop")


def scatter_kv(buf_LBGSK, new_LBTGK, slots_BT):
    """Writes every layer's new keys or values into a stacked cache buffer."""
    new = jnp.moveaxis(new_LBTGK.astype(buf_LBGSK.dtype), 0, 2)  # advanced indices (b, slots) lead
    b = jnp.arange(slots_BT.shape[0])[:, None]
    return buf_LBGSK.at[slice(None), b, slice(None), slots_BT].set(new, mode="drop")


# ----------------------------------------------------------------------------- layers


def acc_dtype(dtype):
    """Accumulation dtype: f32 for f32 / bf16 compute, f64 when computing in f64 (tests)."""
    return jnp.promote_types(dtype, jnp.float32)


def rms_norm(x, weight, eps: float):
    """RMSNorm in (at least) f32, returned in x's dtype."""
    x32 = x.astype(acc_dtype(x.dtype))
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
    x32 = x_BTHK.astype(acc_dtype(x_BTHK.dtype))
    out = x32 * cos_BTK[:, :, None] + rotated.astype(x32.dtype) * sin_BTK[:, :, None]
    return out.astype(x_BTHK.dtype)


def dense(x, w_DF, acc):
    """x @ w_DF accumulated in `acc` (the portable kernel; autodiff's own gradient)."""
    return jnp.einsum("...d,df->...f", x, w_DF, preferred_element_type=acc)


def embed_rows(embed_VD, tokens_BT):
    """embed[tokens] (the portable kernel)."""
    return jnp.take(embed_VD, tokens_BT, axis=0)


@dataclasses.dataclass(frozen=True)
class Kernels:
    """The operations a platform may implement its own way, with the same values: a backend
    (`jaxscaffold.backends`) puts its own in `config.kernels`; None means these."""

    dense: Callable = dense  # (x, w [in, out], acc_dtype) -> x @ w in acc_dtype
    embed_rows: Callable = embed_rows  # (table [V, D], tokens) -> rows
    # Attention over a paged cache's rows' own pages (`paged_kernel.paged_attention`'s
    # signature: the TPU kernel); None: the gather read.
    paged_read: Callable | None = None


PORTABLE = Kernels()


def _dot(x, w_DF, dtype, kernels: Kernels):
    """x @ w in `dtype` with (at least) f32 accumulation (several times faster than pure bf16 on
    CPU)."""
    return kernels.dense(x.astype(dtype), w_DF.astype(dtype), acc_dtype(dtype)).astype(dtype)


# Matrix groups of a layer that read the same input: `project` multiplies each group at once.
QKV, O, GATE_UP, DOWN = ("q", "k", "v"), ("o",), ("gate", "up"), ("down",)


def decoder_layer(config: Qwen3Config, x_BTD, lp, cos, sin, attend, project):
    """One pre-norm decoder block. `attend(q, k, v) -> (attn, kv_out)` is the attention of
    the caller's setting (no cache, a read-only stacked cache, or a per-layer cache that it
    writes first) and `kv_out` what that setting hands back. `project(lp, group, h)` is the
    list of h @ W for the matrices W named in `group` (QKV, O, GATE_UP, DOWN), however the
    caller stores them."""
    c = config
    b, t, _ = x_BTD.shape
    h = rms_norm(x_BTD, lp["attn_norm"], c.rms_norm_eps)
    q, k, v = project(lp, QKV, h)
    if c.qkv_bias:  # Qwen2 (added to the products in the compute dtype)
        q, k, v = (x + lp[name].astype(x.dtype) for x, name in zip((q, k, v), ("q_bias", "k_bias", "v_bias")))
    q = q.reshape(b, t, c.num_heads, c.head_dim)
    k = k.reshape(b, t, c.num_kv_heads, c.head_dim)
    v = v.reshape(b, t, c.num_kv_heads, c.head_dim)
    if c.qk_norm:  # Qwen3
        q, k = rms_norm(q, lp["q_norm"], c.rms_norm_eps), rms_norm(k, lp["k_norm"], c.rms_norm_eps)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    attn, kv_out = attend(q, k, v)
    (out,) = project(lp, O, attn.reshape(b, t, c.q_dim))
    x_BTD = x_BTD + out
    h = rms_norm(x_BTD, lp["mlp_norm"], c.rms_norm_eps)
    gate, up = project(lp, GATE_UP, h)
    (down,) = project(lp, DOWN, jax.nn.silu(gate) * up)
    return x_BTD + down, kv_out


_REMAT_POLICIES = {
    "full": None,  # save nothing: recompute the whole layer in the backward pass
    "save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def remat(layer: Callable, config: Qwen3Config) -> Callable:
    """`layer` under the config's rematerialisation policy (itself when "none")."""
    if config.remat_policy == "none":
        return layer
    return jax.checkpoint(layer, policy=_REMAT_POLICIES[config.remat_policy])


def segment_positions(segment_ids_BT):
    """Position of each token within its (contiguous) segment: restarts at every change of
    segment id, so the first real token of a left-padded row gets position 0."""
    t = segment_ids_BT.shape[1]
    index = jnp.arange(t, dtype=jnp.int32)
    changed = jnp.concatenate(
        [jnp.ones_like(segment_ids_BT[:, :1], bool), segment_ids_BT[:, 1:] != segment_ids_BT[:, :-1]], axis=1)
    starts = lax.cummax(jnp.where(changed, index[None], 0), axis=1)
    return index[None] - starts


def sequence_attention(config: Qwen3Config, segment_ids_BT) -> Callable:
    """`attend(q, k, v) -> attn` of whole sequences without a cache: causal within each
    segment (queries and keys are the same tokens)."""
    b, t = segment_ids_BT.shape
    impl = attention.portable(config.attention_impl)
    index = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    mask_args = dict(q_segment_BT=segment_ids_BT, kv_segment_BS=segment_ids_BT,
                     q_index_BT=index, kv_index_S=jnp.arange(t, dtype=jnp.int32))
    return lambda q, k, v: attention.attend(impl, q, k, v, **mask_args)


def hidden_states(params: dict, config: Qwen3Config, tokens_BT, *, positions_BT=None,
                  segment_ids_BT=None, cache: KVCache | PagedKVCache | None = None, window: int | None = None):
    """The final-normed hidden states h_BTD (the embedding model's output).

    Args:
      tokens_BT: int token ids.
      positions_BT: RoPE positions. Default: the index within the segment (no cache), or
        continuing from the cache length.
      segment_ids_BT: 0 = padding, otherwise a segment id (packed rows attend only within a
        segment). Default: all ones.
      cache: a KVCache or a PagedKVCache; the new tokens (right-padded) are written after
        each row's length; padding is never written, and tokens past the capacity are dropped.
      window: with a cache, attend over its first `window` slots only (static; they must
        hold every row's cached tokens: the caller buckets it), so a decode step reads the
        filled part of the cache, not its capacity. Default: the whole capacity. The same
        values up to f32 rounding: the slots past the window are empty for every row and get
        exactly zero weight, but the sums run over fewer terms.

    Returns:
      h_BTD, or (h_BTD, new_cache) when a cache is given.
    """
    c = config
    b, t = tokens_BT.shape
    dt = jnp.dtype(c.compute_dtype)
    kernels = c.kernels or PORTABLE
    if segment_ids_BT is None:
        segment_ids_BT = jnp.ones((b, t), jnp.int32)
    segment_ids_BT = segment_ids_BT.astype(jnp.int32)
    paged = isinstance(cache, PagedKVCache)
    if cache is None:
        if positions_BT is None:
            positions_BT = segment_positions(segment_ids_BT)
        attend_sequence = sequence_attention(c, segment_ids_BT)

        def attend(q, k, v, i, pools):
            return attend_sequence(q, k, v), None
    elif paged:
        row_positions = cache.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
        if positions_BT is None:
            positions_BT = row_positions
        lengths = cache.lengths + jnp.sum(segment_ids_BT != 0, axis=1).astype(jnp.int32)
        _, _, num_pages, page, _ = cache.k.shape
        places = paged_attention.token_places(cache.table, row_positions, segment_ids_BT, page=page,
                                              num_pages=num_pages)
        width = cache.table.shape[1] if window is None else min(-(-window // page), cache.table.shape[1])
        table = cache.table[:, :width]  # the pages the call attends over

        # Each layer writes its new tokens into its pages, then reads them with the cached ones
        # (one read: the TPU kernel or the gather, for decode and prefill alike). The pools are
        # the layer loop's carry, so the writes are in place.
        def attend(q, k, v, i, pools):
            return paged_attention.write_and_attend(q, k, v, pools, i, places, lengths, table, row_positions,
                                                    kernel=kernels.paged_read)
    else:
        if positions_BT is None:
            positions_BT = cache.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
        slots = cache_slots(segment_ids_BT, cache.lengths, cache.segment_ids.shape[1])
        segments = scatter_rows(cache.segment_ids, segment_ids_BT, slots)
        lengths = cache.lengths + jnp.sum(segment_ids_BT != 0, axis=1).astype(jnp.int32)
        _, _, g, capacity, k_dim = cache.k.shape
        w = capacity if window is None else min(window, capacity)
        seen_BW = cache.segment_ids[:, :w]

        # The cache is read only here and written once after all layers (a scan writing it
        # per layer would copy the whole cache every call). It stays one loop-invariant
        # operand, never copied: each layer reads a static-size dynamic slice of its window,
        # which TPU / GPU fusion reads in place in the score and value products (what
        # `launch/bench.py decode_bytes` assumes).
        def attend(q, k, v, i, pools):
            ck, cv = (lax.dynamic_slice(buf, (i, 0, 0, 0, 0), (1, b, g, w, k_dim))[0] for buf in (cache.k, cache.v))
            return attention.cached_attention(q, ck.astype(dt), cv.astype(dt), k, v, cache_segment_BS=seen_BW,
                                              segment_BT=segment_ids_BT), (k, v)

    cos, sin = rope_tables(positions_BT, c.head_dim, c.rope_theta)
    x = kernels.embed_rows(params["embed"], tokens_BT).astype(dt)

    def project(lp, group, h):
        return [_dot(h, lp[name], dt, kernels) for name in group]

    def layer(carry, xs):
        x, pools = carry
        lp, i = xs
        x, out = decoder_layer(c, x, lp, cos, sin, lambda q, k, v: attend(q, k, v, i, pools), project)
        # The paged layout's layers carry the pools they write; the others hand out their new keys/values.
        return ((x, out), None) if paged else ((x, None), out)

    layer = remat(layer, c)
    layers = params["layers"]
    index = jnp.arange(c.num_layers, dtype=jnp.int32)
    carry = (x, (cache.k, cache.v) if paged else None)
    if c.scan_layers:
        carry, kv_out = lax.scan(layer, carry, (layers, index))
    else:  # unrolled (static slices of the stacked weights: copies on CPU)
        outs = []
        for i in range(c.num_layers):
            carry, out = layer(carry, (jax.tree.map(lambda a, i=i: a[i], layers), index[i]))
            outs.append(out)
        kv_out = None if cache is None or paged else jax.tree.map(lambda *a: jnp.stack(a), *outs)
    x, pools = carry

    h = rms_norm(x, params["final_norm"], c.rms_norm_eps)
    if cache is None:
        return h
    if paged:
        return h, cache._replace(k=pools[0], v=pools[1], lengths=lengths)
    # Every layer's new keys/values in one scatter; padding and overflow are dropped.
    k, v = scatter_kv(cache.k, kv_out[0], slots), scatter_kv(cache.v, kv_out[1], slots)
    return h, KVCache(k=k, v=v, segment_ids=segments, lengths=lengths)


def unembed(params: dict, config: Qwen3Config, h_BTD):
    """Logits in f32 from hidden states (tied embedding or the separate lm_head)."""
    if config.is_embedding:
        raise ValueError("an embedding model (is_embedding=True) has no language-model head")
    dt = jnp.dtype(config.compute_dtype)
    if config.tie_word_embeddings:
        w = params["embed"]
        return jnp.einsum("btd,vd->btv", h_BTD.astype(dt), w.astype(dt),
                          preferred_element_type=acc_dtype(dt))
    return jnp.einsum("btd,dv->btv", h_BTD.astype(dt), params["lm_head"].astype(dt),
                      preferred_element_type=acc_dtype(dt))


def forward(params: dict, config: Qwen3Config, tokens_BT, *, positions_BT=None,
            segment_ids_BT=None, cache: KVCache | None = None):
    """Logits_BTV (f32) of a Qwen3 causal LM; `(logits_BTV, new_cache)` when a cache is given.

    See `hidden_states` for the optional arguments. Jit it with `config` static, e.g.
    `jax.jit(forward, static_argnums=1)`.
    """
    out = hidden_states(params, config, tokens_BT, positions_BT=positions_BT,
                        segment_ids_BT=segment_ids_BT, cache=cache)
    if cache is None:
        return unembed(params, config, out)
    h, new_cache = out
    return unembed(params, config, h), new_cache
