"""Bytes one decode step of the accelerator ("stacked") sampler reads and writes, against the
least it must: the weights once plus the filled part of the KV cache.

Cases: Qwen3-0.6B and Qwen3-4B shapes, bf16 weights, compute and cache, 16 and 128 rows, a
cache of 8,192 slots, every row filled to 1/8, 1/2 and all of it (the new token included). Two
programs per case: the windowed decode (`Sampler(layout="stacked")`: it attends over the
smallest window bucket holding the rows) and the full-capacity one (`window_buckets=(max_len,)`,
what the stacked layout ran before it was windowed). Figures: `bytes_accessed` of one step,
`min_bytes`, their ratio (goal <= 1.3), and what the bytes go to (by HLO opcode).

Nothing is compiled or run: parameters and cache are abstract (`qwen3.param_shapes`,
`jax.eval_shape`) and the sampler's decode chunk is only lowered, one step long
(`Sampler.lower_decode`). The method (`benchmarks.hlo_bytes`, whose docstring has the rules):
- XLA's own cost analysis of the *compiled* program is not usable here. XLA:CPU rewrites a bf16
  program its own way: it has no bf16 scatter and widens the cache write to f32 copies of the
  whole cache, and it copies every weight slice a matmul reads (a step whose lowered module
  counts 85 GB counted 661 GB compiled; at Qwen3-0.6B, 16 rows, fill 1/8, the windowed and
  the full-capacity program compile to 156 and 158 GB: the whole-cache copies dominate both).
  A TPU or GPU compile, the one that matters, needs the device; and any compiled figure counts
  a loop's body (the scan over layers) once.
- So the count is taken from the *lowered* module, whose ops are the program's own, by XLA's
  cost-analysis rules re-applied op by op (unchanged, they reproduce
  `Lowered.cost_analysis()` of the same module: the `xla_check` field, a relative deviation),
  with three changes: the scan over layers counts its body once per layer; slices, dynamic
  slices and reshapes are read where they lie (a layer's weights, its cache window); and
  elementwise ops fuse into elementwise / reduce consumers, as XLA's loop fusion does
  (`bytes_accessed`). `unfused_bytes` is the count without that last change: every
  elementwise op writes its output and reads its operands (an upper bound of a kind: the f32
  attention scores and the sampling over the vocabulary counted once per op).
- Its limits, plainly: it is a model of a fusing compile, not one. It does not know a TPU /
  GPU compiler's copies (a layout change on tiled layouts, a slice left unfused) or its
  further fusions (a multi-output softmax, a dot fused with its consumer); the figures are
  what the program's ops must move if fused as said, to check against a device run (the
  decode tokens/s of `launch/device_check.sh`).
- The fill is the best case of the window buckets (the longest row ends exactly on one): just
  past a bucket a step reads up to 1.5x the filled cache (the half-octave ladder: 1024, 1536,
  2048, ...), 1.14-1.2x on average over a chunk, which fills its window from the one before.

`--quick`: Qwen3-0.6B shapes with 2 layers, 16 rows, a 2,048-slot cache.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from benchmarks import hlo_bytes
from benchmarks.common import REPORT
from jaxscaffold.models import config as model_configs
from jaxscaffold.models import qwen3
from jaxscaffold.rollout.engine import Sampler

FILLS = ((1, 8), (1, 2), (1, 1))
GB = 1e9


def nbytes(tree) -> int:
    return sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def min_bytes(config, params, rows: int, filled: int) -> int:
    """The weights once and every layer's keys and values of the filled slots."""
    kv = 2 * config.num_layers * rows * config.num_kv_heads * filled * config.head_dim * 2  # bf16
    return nbytes(params) + kv


def step_bytes(sampler: Sampler, params, filled: int) -> dict:
    """One decode step of `sampler` with its longest row at `filled` tokens: the per-op count
    (loops x trip count, loop fusion), the same without fusing elementwise ops, XLA's lowered
    cost analysis and the rules' replica of it."""
    state = jax.eval_shape(sampler.init_state)
    window = sampler.decode_window(filled)
    lowered = sampler.lower_decode(params, state, window=window, steps=1)
    text = lowered.as_text(dialect="hlo")
    counted = hlo_bytes.bytes_accessed(text, loops=True, fusion=True)
    unfused = hlo_bytes.bytes_accessed(text, loops=True, fused=True).total
    xla = float(lowered.cost_analysis()["bytes accessed"])
    replica = hlo_bytes.bytes_accessed(text).total
    return {"window": window, "bytes": counted.total, "by_opcode": counted.by_opcode, "unfused": unfused,
            "xla_lowered": xla, "xla_check": replica / xla - 1}


def run(quick: bool = False) -> None:
    if quick:
        cases = [("qwen3-0.6b", {"num_layers": 2}, 16, 2048)]
    else:
        cases = [(name, {}, rows, 8192) for name in ("qwen3-0.6b", "qwen3-4b") for rows in (16, 128)]
    for name, overrides, rows, capacity in cases:
        config = model_configs.preset(name, param_dtype="bfloat16", compute_dtype="bfloat16", **overrides)
        params = qwen3.param_shapes(config)
        programs = {
            "windowed": Sampler(config, stop_ids=(), batch_size=rows, max_len=capacity, layout="stacked"),
            "full": Sampler(config, stop_ids=(), batch_size=rows, max_len=capacity, layout="stacked", window_buckets=(capacity,)),
        }
        REPORT.say(f"# {name} ({config.num_layers} layers), bf16, {rows} rows, cache {capacity}: weights "
                   f"{nbytes(params) / GB:.2f} GB")
        for num, den in FILLS:
            filled = capacity * num // den
            least = min_bytes(config, params, rows, filled)
            for program, sampler in programs.items():
                got = step_bytes(sampler, params, filled)
                dots = got["by_opcode"]["dot"]
                top = ", ".join(f"{op} {b / GB:.2f}" for op, b in got["by_opcode"].most_common(4))
                REPORT.figure(f"decode_bytes {name} rows={rows} fill={num}/{den} {program}", got["bytes"] / GB, "GB",
                              ratio=got["bytes"] / least,
                              note=f"(min {least / GB:.2f} GB, window {got['window']}; GB by op: {top})",
                              fields={"model": name, "layers": config.num_layers, "rows": rows, "capacity": capacity,
                                      "filled": filled, "program": program, "window": got["window"],
                                      "bytes_accessed": got["bytes"], "min_bytes": least,
                                      "dot_bytes": dots, "not_dot_bytes": got["bytes"] - dots,
                                      "unfused_bytes": got["unfused"], "unfused_ratio": got["unfused"] / least,
                                      "xla_lowered_bytes": got["xla_lowered"],
                                      "xla_check": round(got["xla_check"], 6)})
