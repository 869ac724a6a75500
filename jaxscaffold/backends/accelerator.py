"""TPU and GPU: the model as it is. Stacked weights scanned over layers (the compact program
these compilers prefer), a stacked cache in its own dtype, autodiff's dense gradient, XLA's
default options. Also the reference layout on CPU (`Sampler(layout="stacked")`).

A sampler's call attends over a bucketed prefix of the cache (`windowed_hidden_states`), as
on CPU, so a decode step reads the filled part of the cache, not its capacity; a window of
the whole capacity runs the model's own `qwen3.hidden_states`. `launch/bench.py
decode_bytes` counts what one decode step reads at Qwen3-0.6B / 4B shapes."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

from jaxscaffold.models import attention, qwen3
from jaxscaffold.models.config import Qwen3Config


def windowed_hidden_states(params, config: Qwen3Config, tokens_BT, *, segment_ids_BT, cache: qwen3.KVCache,
                           window: int):
    """`qwen3.hidden_states` with a stacked cache, attending over its first `window` slots
    (static; they must hold every row's cached tokens, the caller buckets it) instead of the
    whole capacity. The same values up to f32 rounding: the slots past the window are empty
    for every row and `cached_attention` gives them exactly zero weight, but its sums run
    over fewer terms, in another order (the tests' sampled tokens are equal).

    How it reads the cache: the layers are scanned over their index, the whole cache stays a
    loop-invariant operand (never copied) and each layer takes a static-size dynamic slice of
    its window, for TPU / GPU fusion to read in place in the score and value products (what
    `launch/bench.py decode_bytes` assumes; not yet seen on a device); the new keys and
    values of every layer are written after the loop in one in-place scatter, as the model
    does."""
    c = config
    b, t = tokens_BT.shape
    dt = jnp.dtype(c.compute_dtype)
    kernels = c.kernels or qwen3.PORTABLE
    acc = qwen3.acc_dtype(dt)
    segment_ids_BT = segment_ids_BT.astype(jnp.int32)
    positions_BT = cache.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
    slots = qwen3.cache_slots(segment_ids_BT, cache.lengths, cache.segment_ids.shape[1])
    segments = qwen3.scatter_rows(cache.segment_ids, segment_ids_BT, slots)
    lengths = cache.lengths + jnp.sum(segment_ids_BT != 0, axis=1).astype(jnp.int32)
    seen_BW = cache.segment_ids[:, :window]
    _, _, g, _, k_dim = cache.k.shape

    def attend(i, q, k, v):
        ck, cv = (lax.dynamic_slice(buf, (i, 0, 0, 0, 0), (1, b, g, window, k_dim))[0] for buf in (cache.k, cache.v))
        return attention.cached_attention(q, ck.astype(dt), cv.astype(dt), k, v, cache_segment_BS=seen_BW,
                                          segment_BT=segment_ids_BT), (k, v)

    def project(lp, group, h):
        return [kernels.dense(h.astype(dt), lp[name].astype(dt), acc).astype(dt) for name in group]

    cos, sin = qwen3.rope_tables(positions_BT, c.head_dim, c.rope_theta)
    x = kernels.embed_rows(params["embed"], tokens_BT).astype(dt)

    def layer(x, xs):
        lp, i = xs
        return qwen3.decoder_layer(c, x, lp, cos, sin, lambda q, k, v: attend(i, q, k, v), project)

    layer = qwen3.remat(layer, c)
    index = jnp.arange(c.num_layers, dtype=jnp.int32)
    if c.scan_layers:
        x, (k_new, v_new) = lax.scan(layer, x, (params["layers"], index))
    else:  # unrolled (what a cost analysis counts: it counts a loop's body once)
        outs = []
        for i in range(c.num_layers):
            x, out = layer(x, (jax.tree.map(lambda a, i=i: a[i], params["layers"]), index[i]))
            outs.append(out)
        k_new, v_new = (jnp.stack(a) for a in zip(*outs))
    h = qwen3.rms_norm(x, params["final_norm"], c.rms_norm_eps)
    k, v = qwen3.scatter_kv(cache.k, k_new, slots), qwen3.scatter_kv(cache.v, v_new, slots)
    return h, qwen3.KVCache(k=k, v=v, segment_ids=segments, lengths=lengths)


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """The TPU / GPU backend (hashable, a program key). `platform` chooses the attention
    kernel "auto" means: "gpu" cuDNN flash attention (bf16 / f16), "tpu" Pallas splash on one
    device; everywhere else (a TPU mesh, f32 on GPU, and "portable": what plans and FLOP counts
    compile on fake CPU devices) the pure-JAX flash kernel, O(T) in memory like splash and
    cuDNN, so a plan's activations stand for theirs (the XLA kernel's O(T^2) f32 scores would
    not fit 16k-token rows)."""

    platform: str = "portable"
    name = "accelerator"
    layout = "stacked"
    windowed = True  # a call attends over the bucketed filled prefix of the cache, not all of it

    def with_attention(self, config: Qwen3Config) -> Qwen3Config:
        """The config with "auto" attention resolved for this platform."""
        if config.attention_impl != "auto":
            return config
        return config.replace(attention_impl=self.attention_impl(config.compute_dtype, jax.device_count()))

    def attention_impl(self, compute_dtype: str, devices: int) -> str:
        if self.platform == "gpu" and jnp.dtype(compute_dtype).itemsize == 2:
            return "cudnn"
        if self.platform == "tpu" and devices == 1:
            return "splash"  # under a multi-device mesh a Pallas call needs shard_map; XLA partitions flash itself
        return "flash"

    def with_kernels(self, config: Qwen3Config) -> Qwen3Config:
        return self.with_attention(config)

    def compiler_options(self):
        return None

    def prepare(self, params: dict, config: Qwen3Config) -> dict:
        return params

    def is_prepared(self, params: dict) -> bool:
        return True

    def empty_cache(self, config: Qwen3Config, batch: int, max_len: int, dtype) -> qwen3.KVCache:
        return qwen3.KVCache.empty(config, batch, max_len, dtype)

    def kv_sharding(self, config: Qwen3Config, mesh, rules):
        return rules.sharding(mesh, ("layers", "batch", "cache_heads", "cache_seq", "head_dim"))

    def hidden_states(self, params, config, tokens_BT, *, segment_ids_BT, cache, window):
        if window is None or window >= cache.segment_ids.shape[1]:
            return qwen3.hidden_states(params, config, tokens_BT, segment_ids_BT=segment_ids_BT, cache=cache)
        return windowed_hidden_states(params, config, tokens_BT, segment_ids_BT=segment_ids_BT, cache=cache,
                                      window=window)

    def unembed(self, params, config, h_BTD):
        return qwen3.unembed(params, config, h_BTD)
