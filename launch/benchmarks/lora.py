"""LoRA: what merging costs once per update against applying the adapters unmerged in every
decode step (x W + s (x a) b per target), with the portable forward (`qwen3.forward`, the
accelerator's path) on a KV cache.

The sampler decodes with merged parameters (`lora.merged`, once per update); the unmerged form
is built here only to measure it, as a weight pytree the model's `dense` kernel multiplies by
(`Unmerged`), so the model code is the same in both. Figures: the merge's time, a decode
step's time each way, and how many decode steps the merge costs. `--quick`: the tiny preset;
otherwise Qwen3-0.6B's shapes (random weights, bf16 base and compute, rank 16, every target).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import REPORT, interleaved_medians
from jaxscaffold.models import config as model_configs
from jaxscaffold.models import lora as lora_lib
from jaxscaffold.models import qwen3


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass
class Unmerged:
    """A target matrix with its adapter, multiplied unmerged by `unmerged_dense`."""

    w: jax.Array
    a: jax.Array
    b: jax.Array
    scale: float

    def astype(self, dtype):
        return Unmerged(self.w.astype(dtype), self.a.astype(dtype), self.b.astype(dtype), self.scale)

    def tree_flatten(self):
        return (self.w, self.a, self.b), self.scale

    @classmethod
    def tree_unflatten(cls, scale, children):
        return cls(*children, scale)


def unmerged_dense(x, w, acc):
    if not isinstance(w, Unmerged):
        return qwen3.dense(x, w, acc)
    low = qwen3.dense(x, w.a, acc).astype(x.dtype)
    return qwen3.dense(x, w.w, acc) + w.scale * qwen3.dense(low, w.b, acc)


def run(quick: bool = False) -> None:
    c = model_configs.tiny() if quick else model_configs.preset("qwen3-0.6b")
    c = c.replace(param_dtype="bfloat16", compute_dtype="bfloat16")
    lora = lora_lib.LoraConfig(rank=16, alpha=32.0)
    base = qwen3.init_params(c, jax.random.key(0))
    adapters = lora_lib.init_adapters(c, lora, jax.random.key(1))
    adapters = {t: {"a": v["a"], "b": 0.01 * jnp.ones_like(v["b"])} for t, v in adapters.items()}
    merged = lora_lib.merged(c, base, adapters, lora)
    unmerged = {**base, "layers": {**base["layers"], **{t: Unmerged(base["layers"][t], adapters[t]["a"],
                                                                      adapters[t]["b"], lora.scale)
                                                         for t in lora.targets}}}
    c_unmerged = c.replace(kernels=qwen3.Kernels(dense=unmerged_dense))
    batch, cache_len = 8, 512
    cache = qwen3.KVCache.empty(c, batch, cache_len)
    prompt = jnp.asarray(np.random.RandomState(0).randint(0, c.vocab_size, (batch, 128)))
    fwd = jax.jit(qwen3.forward, static_argnums=1)
    _, cache = fwd(merged, c, prompt, cache=cache)
    token = prompt[:, :1]
    step_merged = lambda: jax.block_until_ready(fwd(merged, c, token, cache=cache)[0])  # noqa: E731
    step_unmerged = lambda: jax.block_until_ready(fwd(unmerged, c_unmerged, token, cache=cache)[0])  # noqa: E731
    merge = lambda: jax.block_until_ready(lora_lib.merged(c, base, adapters, lora))  # noqa: E731
    np.testing.assert_allclose(np.asarray(step_merged(), np.float32), np.asarray(step_unmerged(), np.float32),
                               atol=0.5)  # the same model (bf16 rounding apart)
    reps = 3 if quick else 10
    t = interleaved_medians({"merge": merge, "merged": step_merged, "unmerged": step_unmerged}, reps)
    name = "tiny" if quick else "qwen3-0.6b"
    REPORT.say(f"# {name}, bf16, rank {lora.rank}, targets {','.join(lora.targets)}; decode: batch {batch}, "
               f"cache {cache_len}, portable forward on {jax.default_backend()}")
    REPORT.figure("merge (once per update)", t["merge"] * 1e3, "ms")
    REPORT.figure("decode step, merged weights", t["merged"] * 1e3, "ms")
    REPORT.figure("decode step, unmerged adapters", t["unmerged"] * 1e3, "ms", ratio=t["unmerged"] / t["merged"])
    extra = t["unmerged"] - t["merged"]
    REPORT.figure("decode steps the merge costs (merge / unmerged overhead)", t["merge"] / extra if extra > 0
                  else float("inf"), "steps")
