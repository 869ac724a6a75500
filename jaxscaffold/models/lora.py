"""LoRA: low-rank adapters as a transform of the parameters, so the model stays as it is.

For a target matrix W [in, out] (stacked over layers, as `qwen3` stores it) the adapter is a
pair a [L, in, r], b [L, r, out], and the adapted weight is

    W' = W + (alpha / r) * a @ b

`merge(base, adapters, lora)` returns the parameter tree `qwen3.forward` takes, with every
target replaced by W'. Training differentiates through `merge` with respect to the adapters
only (the base is a frozen argument); the sampler decodes with the merged tree, merged once
per update. a and b are PEFT's lora_A / lora_B transposed (torch Linear weights are
[out, in]): a = lora_A.T, b = lora_B.T, with PEFT's scaling alpha / r (not rsLoRA).

Init as PEFT's default: a ~ kaiming-uniform (bound 1 / sqrt(in)), b = 0, so the adapted
model starts exactly at the base.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxscaffold.models import qwen3
from jaxscaffold.models.config import Qwen3Config
from jaxscaffold.models.sharding import DEFAULT_RULES, ShardingRules, tree_shardings

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Rank, alpha and the adapted matrices (a subset of TARGETS). Hashable: jit-static."""

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = TARGETS

    def __post_init__(self):
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            raise ValueError(f"LoRA targets {list(self.targets)}: need a non-empty subset of {', '.join(TARGETS)}")
        if self.rank < 1:
            raise ValueError(f"LoRA rank {self.rank} must be >= 1")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def adapter_shapes(config: Qwen3Config, lora: LoraConfig, dtype: str = "float32") -> dict:
    """`jax.ShapeDtypeStruct`s of the adapters: {target: {"a": [L, in, r], "b": [L, r, out]}}."""
    base = qwen3.param_shapes(config)["layers"]
    out = {}
    for t in lora.targets:
        n, d_in, d_out = base[t].shape
        out[t] = {"a": jax.ShapeDtypeStruct((n, d_in, lora.rank), jnp.dtype(dtype)),
                  "b": jax.ShapeDtypeStruct((n, lora.rank, d_out), jnp.dtype(dtype))}
    return out


def adapter_logical_axes(config: Qwen3Config, lora: LoraConfig) -> dict:
    """Logical axes of the adapters: a shards its input axis like W, b its output axis; the
    rank axis is replicated (it is small)."""
    base = qwen3.param_logical_axes(config)["layers"]
    return {t: {"a": (base[t][0], base[t][1], None), "b": (base[t][0], None, base[t][2])} for t in lora.targets}


def adapter_shardings(config: Qwen3Config, lora: LoraConfig, mesh, rules: ShardingRules = DEFAULT_RULES) -> dict:
    """NamedSharding of every adapter on `mesh` under `rules`."""
    return tree_shardings(mesh, adapter_logical_axes(config, lora), rules)


def init_adapters(config: Qwen3Config, lora: LoraConfig, key: jax.Array, mesh=None,
                  rules: ShardingRules = DEFAULT_RULES, dtype: str = "float32") -> dict:
    """PEFT's default init: a ~ U(-1/sqrt(in), 1/sqrt(in)), b = 0 (the base model exactly)."""
    out_shardings = None if mesh is None else adapter_shardings(config, lora, mesh, rules)
    return jax.jit(_random_adapters, static_argnums=(0, 1, 3), out_shardings=out_shardings)(config, lora, key, dtype)


def _random_adapters(config, lora, key, dtype):
    shapes = adapter_shapes(config, lora, dtype)
    out = {}
    for t, k in zip(lora.targets, jax.random.split(key, len(lora.targets))):
        a, b = shapes[t]["a"], shapes[t]["b"]
        bound = 1.0 / a.shape[1] ** 0.5
        out[t] = {"a": jax.random.uniform(k, a.shape, jnp.float32, -bound, bound).astype(a.dtype),
                  "b": jnp.zeros(b.shape, b.dtype)}
    return out


def delta(adapters: dict, lora: LoraConfig, target: str):
    """(alpha / r) * a @ b of one target, [L, in, out], in f32 (or f64)."""
    a, b = adapters[target]["a"], adapters[target]["b"]
    acc = qwen3.acc_dtype(a.dtype)
    return lora.scale * jnp.einsum("lir,lro->lio", a, b, preferred_element_type=acc)


def merge(base: dict, adapters: dict, lora: LoraConfig, dtype=None) -> dict:
    """The parameters with every target W replaced by W + (alpha / r) a @ b, summed in f32 and
    stored in `dtype` (default: the wider of W's dtype and f32; pass the model's compute dtype
    to get exactly the values its matmuls would round W' to, in less memory). Other parameters
    are the base's own arrays."""
    layers = dict(base["layers"])
    for t in lora.targets:
        w = base["layers"][t]
        d = delta(adapters, lora, t)
        out_dtype = jnp.promote_types(w.dtype, d.dtype) if dtype is None else jnp.promote_types(w.dtype, dtype)
        layers[t] = (w.astype(d.dtype) + d).astype(out_dtype)
    return {**base, "layers": layers}


@functools.partial(jax.jit, static_argnums=(0, 3))
def merged(config: Qwen3Config, base: dict, adapters: dict, lora: LoraConfig) -> dict:
    """`merge` into the model's compute dtype (widened to the base's), jitted: W' at the
    precision the forward multiplies with (bf16 for a bf16 model, f32 when either is f32),
    what the sampler decodes with, merged once per update."""
    return merge(base, adapters, lora, dtype=config.compute_dtype)
