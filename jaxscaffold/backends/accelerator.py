"""TPU and GPU: the model as it is. Stacked weights scanned over layers (the compact program
these compilers prefer), a stacked cache in its own dtype, autodiff's dense gradient, XLA's
default options. Also the reference layout on CPU (`Sampler(layout="stacked")`).

A sampler's call attends over a bucketed prefix of the cache (`qwen3.hidden_states`'s
`window`), as on CPU, so a decode step reads the filled part of the cache, not its capacity.
`launch/bench.py decode_bytes` counts what one decode step reads at Qwen3-0.6B / 4B shapes."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxscaffold.models import qwen3
from jaxscaffold.models.config import Qwen3Config


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """The TPU / GPU backend (hashable, a program key). `platform` chooses the attention
    kernel "auto" means: "gpu" cuDNN flash attention (bf16 / f16), "tpu" Pallas splash, on one
    device or on any mesh (there each device runs the kernel on its rows and heads under
    `shard_map`: `models.sharded_attention`, the mesh a train step is traced under); everywhere
    else (f32 on GPU, and "portable": what plans and FLOP counts compile on fake CPU devices)
    the pure-JAX flash kernel, O(T) in memory like splash and cuDNN, so a plan's activations
    stand for theirs (the XLA kernel's O(T^2) f32 scores would not fit 16k-token rows)."""

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
        """The kernel "auto" runs on `devices` devices of this platform (any mesh: the fused
        kernels run under shard_map there)."""
        if self.platform == "gpu" and jnp.dtype(compute_dtype).itemsize == 2:
            return "cudnn"
        if self.platform == "tpu":
            return "splash"
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
        return qwen3.hidden_states(params, config, tokens_BT, segment_ids_BT=segment_ids_BT, cache=cache,
                                   window=window)

    def unembed(self, params, config, h_BTD):
        return qwen3.unembed(params, config, h_BTD)
