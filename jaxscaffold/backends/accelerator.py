"""TPU and GPU: the model as it is. Stacked weights scanned over layers (the compact program
these compilers prefer), a stacked cache in its own dtype, autodiff's dense gradient, XLA's
default options. Also the reference layout on CPU (`SamplerOptions(layout="stacked")`).

A sampler's call attends over a bucketed prefix of the cache (`qwen3.hidden_states`'s
`window`), as on CPU, so a decode step reads the filled part of the cache, not its capacity.
`launch/bench.py decode_bytes` counts what one decode step reads at Qwen3-0.6B / 4B shapes.

The sampler's cache is contiguous (`max_len` slots a row) or paged (`kv_cache="paged"`: one
pool of `page_size`-token pages, a page table a row, `qwen3.PagedKVCache`); the paged decode
and prefill read through the Pallas kernel on TPU (`models.paged_kernel`), the gather elsewhere."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxscaffold.models import paged_kernel, qwen3
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
    kv_cache: str = "contiguous"  # the sampler's cache: "contiguous" (max_len slots a row) or "paged"
    page_size: int = 64  # tokens a page (paged)
    name = "accelerator"
    layout = "stacked"
    windowed = True  # a call attends over the bucketed filled prefix of the cache, not all of it

    def __post_init__(self):
        if self.kv_cache not in ("contiguous", "paged"):
            raise ValueError(f"unknown kv_cache {self.kv_cache!r} (contiguous, paged)")
        if self.page_size < 1:
            raise ValueError(f"page_size={self.page_size} must be at least 1")

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

    def empty_cache(self, config: Qwen3Config, batch: int, max_len: int, dtype, *, pages: int = 0):
        """An empty cache: contiguous, or a pool of `pages` pages (0: enough for every row at
        `max_len`, and the scratch page)."""
        if self.kv_cache == "contiguous":
            return qwen3.KVCache.empty(config, batch, max_len, dtype)
        pages = pages or self.pages_for(batch, max_len)
        return qwen3.PagedKVCache.empty(config, batch, max_len, pages=pages, page_size=self.page_size, dtype=dtype)

    def pages_for(self, batch: int, max_len: int, shards: int = 1) -> int:
        """Pages of a pool that holds `batch` rows of `max_len` tokens, and the scratch page of
        each of its `shards` parts."""
        return batch * -(-max_len // self.page_size) + shards

    def kv_sharding(self, config: Qwen3Config, mesh, rules):
        if self.kv_cache == "paged":  # one part of the pool per data shard, its rows' pages
            return rules.sharding(mesh, ("layers", "cache_heads", "batch", None, "head_dim"))
        return rules.sharding(mesh, ("layers", "batch", "cache_heads", "cache_seq", "head_dim"))

    def paged_read(self) -> str:
        """The paged cache's read, in decode and prefill: "pallas" (the TPU kernel,
        `models.paged_kernel`, any cache dtype) or "gather"."""
        return "pallas" if self.platform == "tpu" else "gather"

    def hidden_states(self, params, config, tokens_BT, *, segment_ids_BT, cache, window):
        if isinstance(cache, qwen3.PagedKVCache) and self.paged_read() == "pallas":
            kernels = dataclasses.replace(config.kernels or qwen3.PORTABLE, paged_read=paged_kernel.paged_attention)
            config = config.replace(kernels=kernels)
        return qwen3.hidden_states(params, config, tokens_BT, segment_ids_BT=segment_ids_BT, cache=cache,
                                   window=window)

    def unembed(self, params, config, h_BTD):
        return qwen3.unembed(params, config, h_BTD)
