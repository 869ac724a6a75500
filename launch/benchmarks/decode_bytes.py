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
(`Sampler.lower_decode`). The method (`benchmarks.hlo_bytes`):
- XLA's own cost analysis of the *compiled* program is not usable here. XLA:CPU rewrites a bf16
  program its own way: it has no bf16 scatter and widens the cache write to f32 copies of the
  whole cache, and it copies every weight slice a matmul reads (measured: 661 GB for a step
  whose lowered module counts 85 GB). A TPU or GPU compile, the one that matters, needs the
  device. Its figure would count a loop's body once, too.
- So the count is taken from the *lowered* (unoptimised) module, whose ops are the program's
  own, by XLA's cost-analysis rules re-applied op by op (the bench checks that, unchanged, they
  reproduce `Lowered.cost_analysis()` of the same module: `xla_check`), with two changes:
  loops with a stated trip count (the scan over layers) count their body that many times, and
  slices, dynamic slices and (row-major) reshapes are free, their consumers reading the bytes
  where they lie, as TPU / GPU fusion reads a layer's weights or cache window.
- What it does not model, plainly: every other op counts as unfused, writing its output and
  reading its operands (the f32 attention scores and softmax, the sampling over the vocabulary
  are counted once per elementwise op; a fusing compiler moves them once or twice): an
  overcount, listed as "not dot" bytes. And a compiler's own copies (a layout change on TPU's
  tiled layouts, a slice it does not fuse) are not counted; only a device compile (or a run)
  shows those.
- The fill is the best case of the window buckets (a row ending exactly on one); a chunk
  starting just past a bucket reads up to 1.5x the filled cache (the half-octave ladder: 1024,
  1536, 2048, ...), about 1.2x averaged over a chunk.

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
    (loops x trip count, slices fused), XLA's lowered cost analysis and the rules' replica of it."""
    state = jax.eval_shape(sampler.init_state)
    window = sampler.decode_window(filled)
    lowered = sampler.lower_decode(params, state, window=window, steps=1)
    text = lowered.as_text(dialect="hlo")
    counted = hlo_bytes.bytes_accessed(text, loops=True, fused=True)
    xla = float(lowered.cost_analysis()["bytes accessed"])
    replica = hlo_bytes.bytes_accessed(text).total
    return {"window": window, "bytes": counted.total, "by_opcode": counted.by_opcode, "xla_lowered": xla,
            "xla_check": replica / xla - 1}


def run(quick: bool = False) -> None:
    if quick:
        cases = [("qwen3-0.6b", dict(num_layers=2), 16, 2048)]
    else:
        cases = [(name, {}, rows, 8192) for name in ("qwen3-0.6b", "qwen3-4b") for rows in (16, 128)]
    for name, overrides, rows, capacity in cases:
        config = model_configs.preset(name, param_dtype="bfloat16", compute_dtype="bfloat16", **overrides)
        params = qwen3.param_shapes(config)
        programs = {
            "windowed": Sampler(config, batch_size=rows, max_len=capacity, layout="stacked"),
            "full": Sampler(config, batch_size=rows, max_len=capacity, layout="stacked", window_buckets=(capacity,)),
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
                                      "xla_lowered_bytes": got["xla_lowered"],
                                      "xla_check": round(got["xla_check"], 6)})
