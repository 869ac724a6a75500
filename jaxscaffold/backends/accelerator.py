"""TPU and GPU: the model as it is. Stacked weights scanned over layers (the compact program
these compilers prefer), a stacked cache in its own dtype, autodiff's dense gradient, XLA's
default options. Also the reference layout on CPU (`Sampler(layout="stacked")`)."""

from __future__ import annotations

import dataclasses

from jaxscaffold.models import qwen3
from jaxscaffold.models.config import Qwen3Config


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """The TPU / GPU backend (no state; hashable, a program key)."""

    name = "accelerator"
    layout = "stacked"
    windowed = False  # a call attends over the whole cache

    def with_kernels(self, config: Qwen3Config) -> Qwen3Config:
        return config

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
        del window  # the whole cache
        return qwen3.hidden_states(params, config, tokens_BT, segment_ids_BT=segment_ids_BT, cache=cache)

    def unembed(self, params, config, h_BTD):
        return qwen3.unembed(params, config, h_BTD)
