"""Bytes one decode step of the accelerator ("stacked") sampler reads and writes, against the
least it must: the weights once plus the filled part of the KV cache.

Cases: Qwen3-0.6B and Qwen3-4B shapes, bf16 weights, compute and cache, 16 and 128 rows, a
cache of 8,192 slots, every row filled to 1/8, 1/2 and all of it (the new token included). Two
programs per case: the windowed decode (`SamplerOptions(layout="stacked")`: it attends over the
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

A batch of mixed lengths (half the rows at 1/8 of the cache, half full), per case: bytes of a
step against the weights and the filled KV (`min_bytes` of the rows' own lengths), for
- `mixed_contiguous`: the windowed contiguous decode (every row reads the longest row's window);
- `mixed_paged`: the paged decode (`SamplerOptions(kv_cache="paged")`, pages of 64) as it runs on
  TPU: every op counted as above but the attention read (the ops under the `paged_read`
  scope), which the Pallas kernel does instead, counted as the kernel moves it: each row's own
  pages of keys and values (ceil(length / page) pages a row, a layer), its queries and output,
  the lengths and the page table (`kernel_bytes`);
- `mixed_paged_gather`: the same program as XLA runs it elsewhere (GPU, CPU): the gather read
  of every row's pages up to the longest row's window, counted op by op.
The ratios are the figures' `ratio` and their fields `mixed_contiguous_over_min`,
`mixed_paged_over_min` (goal <= 1.2) and `mixed_paged_gather_over_min`.

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
from jaxscaffold.rollout.engine import Sampler, SamplerOptions

FILLS = ((1, 8), (1, 2), (1, 1))
PAGE = 64  # tokens a page of the paged cache (`rollout.page_size`'s default)
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


def kernel_bytes(config, lengths: np.ndarray, page: int, table_width: int) -> int:
    """What the TPU paged-attention kernel moves in one decode step, all layers: per layer and
    row, the keys and values of its own ceil(length / page) pages (bf16), its queries read and
    its output written (bf16), and the lengths and page table (int32)."""
    c, b = config, len(lengths)
    pages = int(np.sum(-(-lengths // page)))
    kv = 2 * pages * page * c.num_kv_heads * c.head_dim * 2
    q_out = 2 * b * c.num_heads * c.head_dim * 2
    return c.num_layers * (kv + q_out + 4 * b * (table_width + 1))


def paged_step_bytes(sampler: Sampler, params, lengths: np.ndarray) -> dict:
    """One decode step of a paged sampler whose rows hold `lengths` tokens (the new one
    included): the op-by-op count of the program as lowered (the gather read), and the same
    with its read replaced by the TPU kernel's (`kernel_bytes`)."""
    state = jax.eval_shape(sampler.init_state)
    window = sampler.decode_window(int(lengths.max()))
    text = sampler.lower_decode(params, state, window=window, steps=1).as_text(dialect="hlo", debug_info=True)
    gather = hlo_bytes.bytes_accessed(text, loops=True, fusion=True)
    outside = hlo_bytes.bytes_accessed(text, loops=True, fusion=True, skip_scope="paged_read")
    kernel = kernel_bytes(sampler.config, lengths, sampler.backend.page_size, state.cache.table.shape[1])
    return {"window": window, "gather": gather.total, "kernel": outside.total + kernel, "read_by_kernel": kernel,
            "gather_read": gather.total - outside.total}


def mixed(name: str, config, params, rows: int, capacity: int, contiguous: dict) -> None:
    """The mixed-length batch's figures (the module docstring); `contiguous`: the windowed
    contiguous step at the longest row's fill (its program does not depend on the others)."""
    lengths = np.array([capacity // 8] * (rows // 2) + [capacity] * (rows - rows // 2))
    least = min_bytes(config, params, 1, int(lengths.sum()))
    pages = int(np.sum(-(-lengths // PAGE))) + 1
    sampler = Sampler(config, stop_ids=(), batch_size=rows, max_len=capacity,
                      options=SamplerOptions(layout="stacked", kv_cache="paged", page_size=PAGE, kv_pages=pages))
    paged = paged_step_bytes(sampler, params, lengths)
    common = {"model": name, "layers": config.num_layers, "rows": rows, "capacity": capacity,
              "filled": int(lengths.mean()), "lengths": f"{rows // 2} x {capacity // 8}, {rows - rows // 2} x {capacity}",
              "min_bytes": least, "page": PAGE}
    for program, got, extra in (("mixed_contiguous", contiguous["bytes"], {"window": contiguous["window"]}),
                                ("mixed_paged", paged["kernel"], {"read_by_kernel": paged["read_by_kernel"]}),
                                ("mixed_paged_gather", paged["gather"], {"window": paged["window"],
                                                                         "gather_read": paged["gather_read"]})):
        REPORT.figure(f"decode_bytes {name} rows={rows} mixed {program.removeprefix('mixed_')}", got / GB, "GB",
                      ratio=got / least, note=f"(min {least / GB:.2f} GB: half the rows at 1/8, half full)",
                      fields={**common, "program": program, "bytes_accessed": got, f"{program}_over_min": got / least,
                              **extra})


def run(quick: bool = False) -> None:
    if quick:
        cases = [("qwen3-0.6b", {"num_layers": 2}, 16, 2048)]
    else:
        cases = [(name, {}, rows, 8192) for name in ("qwen3-0.6b", "qwen3-4b") for rows in (16, 128)]
    for name, overrides, rows, capacity in cases:
        config = model_configs.preset(name, param_dtype="bfloat16", compute_dtype="bfloat16", **overrides)
        params = qwen3.param_shapes(config)
        programs = {
            "windowed": Sampler(config, stop_ids=(), batch_size=rows, max_len=capacity,
                                options=SamplerOptions(layout="stacked")),
            "full": Sampler(config, stop_ids=(), batch_size=rows, max_len=capacity,
                            options=SamplerOptions(layout="stacked", window_buckets=(capacity,))),
        }
        REPORT.say(f"# {name} ({config.num_layers} layers), bf16, {rows} rows, cache {capacity}: weights "
                   f"{nbytes(params) / GB:.2f} GB")
        for num, den in FILLS:
            filled = capacity * num // den
            least = min_bytes(config, params, rows, filled)
            for program, sampler in programs.items():
                got = step_bytes(sampler, params, filled)
                if filled == capacity and program == "windowed":
                    longest = got
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
        mixed(name, config, params, rows, capacity, longest)
