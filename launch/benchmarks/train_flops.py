"""Train-step FLOPs as compiled: the flop count of ONE optimizer step of the accelerators'
program (`backends.accelerator.Accelerator`, as `train/memory_plan.py` builds it) at Qwen3-4B
shapes and FEE's worst-case batch (`memory_plan.worst_case_batch(configs/fee.py)`: 128 rows x
16,384 tokens, every position scored, one micro-batch), per remat policy, against the textbook
count and with the excess taken apart.

The reference (`reference_flops`), forward 2 + backward 4 flops per multiply-add:
- 6 x N x R x T: N the layers' matmul parameters (q, k, v, o, gate, up, down; norms and the
  embedding *lookup* are not matmuls), over all R x T tokens (every token runs through the
  layers, trained on or not);
- 6 x V x D x R x P: the unembedding (tied to the embedding in Qwen3-4B), on the P scored
  positions a row (the step unembeds only those: `score_masked_only`);
- 6 x L x R x H x K x T^2: attention's two matmuls (2 x 2 H K T^2 a layer and row forward),
  halved for causality, x 3 with the backward.

What the implementation computes beyond it (`excess_terms`, every term a matmul; the fields
`excess_*`, and `excess_other_dots` what they leave unexplained, 0 at every policy here):
- causal blocks: the XLA attention (`models.attention.causal_attention`) runs 8 query blocks,
  each over the keys up to its end: 36/64 of the score matrix, not 1/2 (+1/8 of attention);
- remat recompute: `full` runs each layer's forward again in the backward, all but its last
  matmul, the down projection, whose output the backward does not read (`remat_projections`
  +2 (N - D F) R T, `remat_attention` the attention forward in its blocks); `save_dots` keeps
  the projections' outputs (dots without batch dimensions) but recomputes attention's two
  einsums (batch dimensions b, g): the attention forward again; `none` nothing;
- logprob chunks: the unembedding runs under `jax.checkpoint` chunk by chunk
  (`rl.logprobs`), so its forward runs again in the backward (8 V D R P instead of 6);
- masking: the scored positions P are a static bucket >= the longest row's masked count; in
  the worst case it is T (nothing saved), so a last case scores one turn (P = 2,048) to show
  what masked scoring saves. Padding and the masked upper triangle inside each block are
  computed in full (the mask is applied to computed scores).
The rest of the count is element-wise (norms, RoPE, softmax, the loss, Adam): `excess_elementwise`.

The count: nothing is compiled or run. Parameters are `jax.eval_shape`d, the step is only
lowered, and its HLO counted op by op by XLA's cost-analysis flop rules (`hlo_flops`; unchanged
they reproduce `Lowered.cost_analysis()["flops"]`: the `xla_check` field). XLA's cost analysis,
of the lowered and of the compiled program alike, counts a while loop's body ONCE, whatever its
trip count (the scan over layers, the logprob chunks, micro-batches): `hlo_flops(loops=True)`
counts a body once per trip (`hlo_bytes.trip_count`), and counts only live instructions (what
the computation's root uses; XLA's dead-code pass drops the rest before a compile). A loop
whose trip count is no constant (a `fori_loop` bounded by an outer loop's counter, as a
blockwise causal attention's would be) still counts once: the `unresolved_loops` field says
how many there are (0 here), each making the figure an undercount.
`--quick`: Qwen3-4B shapes with 2 layers, 8 rows x 1,024 tokens (one turn: 128 positions).

The kernel a run trains with: the step is counted with the XLA attention (the only one whose
HLO has constant trip counts), and each case also gives `run_flops_<platform>`: the count with
the XLA attention's matmuls replaced by those of the kernel the platform's backend runs
(`kernel_attention_flops`: splash on TPU, cuDNN on GPU in bf16, else the flash loop), and
`kernel_<platform>`. Per pair of (query, key) tiles a kernel visits, forward 2 matmuls;
backward: XLA 4; the flash loop and cuDNN 5 (the scores recomputed); splash 7 (its dq and
dkv kernels each recompute the scores and dP). Visited: XLA its 8 blocks; flash the causal
tiles of 512 ((n + 1) / 2n of T^2), splash of 128; cuDNN, given a mask not a causal flag, all.
Remat (`full`, `save_dots`) runs the kernel's forward again.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

import jax
import jax.numpy as jnp

from benchmarks import hlo_bytes
from benchmarks.common import REPORT
from jaxscaffold import config as config_lib
from jaxscaffold.backends.accelerator import Accelerator
from jaxscaffold.models import qwen3
from jaxscaffold.rl.train_step import BATCH_AXES, init_train_state
from jaxscaffold.train.job_spec import JobSpec
from jaxscaffold.train.memory_plan import worst_case_batch

POLICIES = ("none", "full", "save_dots")
# `models.attention.causal_attention`'s query blocks: at most 8, of at least 32 tokens (if the
# model's change, the `excess_other_dots` field stops being 0 and its test fails).
CAUSAL_BLOCKS, MIN_BLOCK = 8, 32
CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")

# XLA's HloCostAnalysis: these count as transcendentals, not flops; every other element-wise op
# one flop per output element; data movement (broadcast, slice, gather, transpose, ...) none.
_TRANSCENDENTAL = {"exponential", "exponential-minus-one", "log", "log-plus-one", "logistic", "power", "rsqrt",
                   "sqrt", "cbrt", "tanh", "sine", "cosine", "tan", "atan2", "erf"}
_ELEMENTWISE = {"abs", "add", "and", "ceil", "clamp", "compare", "convert", "divide", "floor", "is-finite", "maximum",
                "minimum", "multiply", "negate", "not", "or", "popcnt", "remainder", "round-nearest-afz",
                "round-nearest-even", "select", "shift-left", "shift-right-arithmetic", "shift-right-logical",
                "sign", "subtract", "xor"}


@dataclasses.dataclass
class Flops(hlo_bytes.Counted):
    """A flop count (total, by_opcode) and the loops it took once for want of a constant trip
    count (a `fori_loop` whose bound is another loop's counter): each makes it an undercount."""

    unresolved_loops: int = 0


def _elements(shape: str) -> int:
    """Elements of an array type; of a tuple, its first array's (a variadic reduce's output)."""
    m = re.search(r"\w+\[([\d,]*)\]", shape)
    return 0 if m is None else math.prod(int(d) for d in m.group(1).split(",") if d)


def _dims(shape: str) -> list[int]:
    m = re.match(r"\w+\[([\d,]*)\]", shape)
    return [int(d) for d in m.group(1).split(",") if d]


def _live(insts: list[hlo_bytes.Instruction]) -> list[hlo_bytes.Instruction]:
    """The instructions a computation's root depends on (XLA's dead-code elimination)."""
    by_name = {i.name: i for i in insts}
    stack, live = [i.name for i in insts if i.root], set()
    while stack:
        name = stack.pop()
        if name in live or name not in by_name:
            continue
        live.add(name)
        stack.extend(by_name[name].operands)
    return [i for i in insts if i.name in live]


def hlo_flops(text: str, *, loops: bool = False, live_only: bool = False) -> Flops:
    """Flops of the HLO module `text` (`Lowered.as_text("hlo")`) by XLA's cost-analysis rules:
    a dot 2 x output elements x contracted size; an element-wise op (compare, select, convert
    included) one per output element, a transcendental none (XLA counts those apart); a
    reduce (or reduce-window, scatter) its computation's flops per element combined; sort,
    data movement and loop bookkeeping none but what their computations compute. A call
    counts its computation; a while loop its body and condition once, or with `loops`, once
    per trip where the text states the trip count (`unresolved_loops` counts the others).
    `live_only`: dead instructions count nothing. By opcode in `by_opcode`."""
    comps, entry = hlo_bytes.parse(text)
    counted = Flops()

    def scalar_flops(comp: str) -> float:  # a reduce's / scatter's combiner, per application
        sub = hlo_bytes.Counted()
        visit(comp, 1.0, sub)
        return sub.total

    def visit(comp: str, times: float, out: hlo_bytes.Counted) -> None:
        insts = _live(comps[comp]) if live_only else comps[comp]
        shapes = {i.name: i.shape for i in comps[comp]}
        for inst in insts:
            op = inst.opcode
            if op == "dot":
                lhs = _dims(shapes[inst.operands[0]])
                m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", inst.attrs)
                contracted = math.prod(lhs[int(d)] for d in m.group(1).split(",") if d) if m else 1
                out.add(op, 2.0 * _elements(inst.shape) * contracted * times)
            elif op in _ELEMENTWISE:
                out.add(op, float(_elements(inst.shape)) * times)
            elif op == "reduce":
                inputs = inst.operands[: len(inst.operands) // 2]
                combined = _elements(shapes[inputs[0]]) - _elements(inst.shape)
                out.add(op, combined * scalar_flops(hlo_bytes.attr(inst, "to_apply")) * times)
            elif op == "reduce-window":
                window = re.search(r"size=([\dx]+)", inst.attrs)
                per = math.prod(int(s) for s in window.group(1).split("x")) - 1 if window else 0
                out.add(op, _elements(inst.shape) * per * scalar_flops(hlo_bytes.attr(inst, "to_apply")) * times)
            elif op == "scatter":
                updates = _elements(shapes[inst.operands[-1]])
                out.add(op, updates * scalar_flops(hlo_bytes.attr(inst, "to_apply")) * times)
            elif op == "call":
                visit(hlo_bytes.attr(inst, "to_apply"), times, out)
            elif op == "while":
                trips = hlo_bytes.trip_count(comps, hlo_bytes.attr(inst, "condition")) if loops else None
                counted.unresolved_loops += loops and trips is None
                n = times * (1 if trips is None else trips)
                visit(hlo_bytes.attr(inst, "body"), n, out)
                visit(hlo_bytes.attr(inst, "condition"), n, out)
            elif op in ("conditional", "custom-call"):
                raise hlo_bytes.UnsupportedHlo(f"{op} {inst.name}: its flops are not in the HLO text")

    visit(entry, 1.0, counted)
    return counted


def reference_flops(c, rows: int, length: int, scored: int) -> dict[str, float]:
    """The textbook count (module docstring): 6 N R T + 6 V D R P + causal attention x 3."""
    d, k = c.hidden_size, c.head_dim
    per_layer = d * (c.num_heads + 2 * c.num_kv_heads) * k + c.num_heads * k * d + 3 * d * c.intermediate_size
    layers = 6.0 * c.num_layers * per_layer * rows * length
    head = 6.0 * c.vocab_size * d * rows * scored
    attention = 6.0 * c.num_layers * rows * c.num_heads * k * length * length  # 3 x 2 matmuls x 2 x T^2 / 2
    return {"layers": layers, "lm_head": head, "attention": attention, "total": layers + head + attention}


def block_fraction(length: int) -> float:
    """The part of the T x T score matrix `causal_attention` computes (1 without blocks)."""
    n = min(CAUSAL_BLOCKS, length // MIN_BLOCK)
    if n <= 1:
        return 1.0
    size = -(-length // n)
    return sum(min(i + size, length) * min(size, length - i) for i in range(0, length, size)) / length ** 2


def excess_terms(c, rows: int, length: int, scored: int, policy: str) -> dict[str, float]:
    """The matmul flops the implementation adds to the reference (module docstring)."""
    ref = reference_flops(c, rows, length, scored)
    attention = ref["attention"] * block_fraction(length) / 0.5  # as computed: forward 1/3, backward 2/3
    # Full remat's second forward stops before the down projection: the layer's backward needs
    # its input, not its output (jax drops what the backward does not read).
    down = 2.0 * c.num_layers * c.hidden_size * c.intermediate_size * rows * length
    projections = ref["layers"] / 3 - down if policy == "full" else 0.0
    return {"causal_blocks": attention - ref["attention"], "remat_projections": projections,
            "remat_attention": 0.0 if policy == "none" else attention / 3, "logprob_recompute": ref["lm_head"] / 3}


# Attention matmuls over the visited score entries, forward + backward, per kernel.
KERNEL_MATMULS = {"xla": 6, "flash": 7, "cudnn": 7, "splash": 9}
KERNEL_TILES = {"flash": 512, "splash": 128}  # causal tiles; above the diagonal never visited


def visited_fraction(kernel: str, length: int) -> float:
    """The part of the T x T score matrix a kernel computes."""
    if kernel == "xla":
        return block_fraction(length)
    if kernel == "cudnn":
        return 1.0
    n = -(-length // KERNEL_TILES[kernel])
    return (n + 1) / (2 * n)


def kernel_attention_flops(kernel: str, c, rows: int, length: int, policy: str) -> float:
    """Attention's matmul flops in one step with `kernel` (module docstring)."""
    matmul = 2.0 * c.num_layers * rows * c.num_heads * c.head_dim * length * length  # one matmul, all of T^2
    recompute = 0 if policy == "none" else 2
    return (KERNEL_MATMULS[kernel] + recompute) * visited_fraction(kernel, length) * matmul


def run_kernels(config) -> dict[str, str]:
    """The training attention kernel each platform's backend runs for `config`."""
    return {p: Accelerator(p).attention_impl(config.compute_dtype, 1) for p in ("tpu", "gpu", "portable")}


def lowered_step(cfg, config, rows: int, length: int, scored: int):
    """The train step `memory_plan.plan` compiles (one device, no mesh) for `cfg`'s job spec
    with the model `config`, lowered for abstract arguments: the FLOP count of a step does not
    depend on how it is sharded."""
    # Counted with the XLA attention kernel, explicitly: the accelerators' portable choice is now
    # `flash`, whose causal inner loops run i + 1 tiles (no constant trip count to multiply). With
    # flash, attention computes (n + 1) / 2n of T^2 (n tiles of 512) and its backward recomputes
    # the score tiles: 7 attention matmuls a tile pair instead of 6.
    config = config.replace(attention_impl="xla")
    # One micro-batch: splitting the rows into fee.py's micro-batches runs the same work in a loop
    # (and the quick case's 8 rows would not split into 32).
    spec = dataclasses.replace(JobSpec.from_config(cfg), model=config, micro_batches=1)
    step = spec.train_step(backend=Accelerator())
    opt = spec.optimizer.make()
    state = jax.eval_shape(lambda p: init_train_state(p, opt), spec.trained_shapes())
    ints = ("tokens_BT", "segment_ids_BT", "loss_mask_BT")
    batch = {name: jax.ShapeDtypeStruct((rows, length)[: len(axes)], jnp.int32 if name in ints else jnp.float32)
             for name, axes in BATCH_AXES.items()}
    # The step's frozen argument: the reference (a copy of the parameters), or LoRA's base.
    ref = (state.params,) if spec.reference_copy else ()
    if spec.lora is not None:
        ref = (qwen3.param_shapes(config),)
    return step.lower(state, batch, *ref, num_positions=scored)


def step_flops(cfg, config, rows: int, length: int, scored: int) -> dict:
    """One step's count: per trip and live (dots apart), and XLA's lowered cost analysis with
    the rules' replica of it (loop bodies once)."""
    lowered = lowered_step(cfg, config, rows, length, scored)
    text = lowered.as_text(dialect="hlo")
    counted = hlo_flops(text, loops=True, live_only=True)
    xla = float(lowered.cost_analysis()["flops"])
    return {"flops": counted.total, "dot_flops": counted.by_opcode["dot"], "xla_lowered": xla,
            "unresolved_loops": counted.unresolved_loops,
            "xla_check": hlo_flops(text).total / xla - 1}


def fee_config(quick: bool):
    """configs/fee.py (a RunConfig), its model config, and the batch counted: (rows, length,
    scored positions) of `worst_case_batch`, and one turn's positions (the masked case)."""
    cfg, _, _ = config_lib.from_command_line(["--config", "fee.py"], CONFIGS)
    config = JobSpec.from_config(cfg).model
    rows, length, scored = worst_case_batch(cfg)
    turn = min(scored, cfg.rollout.max_new_tokens)
    if quick:
        config, rows, length, scored, turn = config.replace(num_layers=2), 8, 1024, 1024, 128
    return cfg, config, rows, length, scored, turn


def run(quick: bool = False) -> None:
    cfg, base, rows, length, scored, turn = fee_config(quick)
    ref = reference_flops(base, rows, length, scored)
    REPORT.say(f"# Qwen3-4B shapes ({base.num_layers} layers), FEE's worst-case batch: {rows} rows x {length} "
               f"tokens, {scored} scored a row; reference {ref['total']:.4g} (layers {ref['layers']:.3g}, "
               f"lm_head {ref['lm_head']:.3g}, attention {ref['attention']:.3g}); attention blocks compute "
               f"{block_fraction(length):.4f} of T^2")
    # The last case scores one turn (2,048 positions a row): what masked scoring saves.
    cases = [(policy, scored) for policy in POLICIES] + [("full", turn)]
    for policy, positions in cases:
        reference = reference_flops(base, rows, length, positions)["total"]
        excess = excess_terms(base, rows, length, positions, policy)
        got = step_flops(cfg, base.replace(remat_policy=policy), rows, length, positions)
        unexplained = got["dot_flops"] - reference - sum(excess.values())
        parts = {**excess, "other_dots": unexplained, "elementwise": got["flops"] - got["dot_flops"]}
        note = ", ".join(f"{k} {v / reference:+.3f}" for k, v in parts.items())
        xla_attention = kernel_attention_flops("xla", base, rows, length, policy)
        kernels = {}
        for platform, kernel in run_kernels(base).items():
            kernels[f"kernel_{platform}"] = kernel
            kernels[f"run_flops_{platform}"] = (got["flops"] - xla_attention
                                                + kernel_attention_flops(kernel, base, rows, length, policy))
        REPORT.figure(f"train_flops remat={policy} scored={positions}", got["flops"] / 1e12, "TFLOP",
                      ratio=got["flops"] / reference, note=f"(of the reference: {note})",
                      fields={"policy": policy, "layers": base.num_layers, "rows": rows, "length": length,
                              "scored": positions, "flops": got["flops"], "reference_flops": reference,
                              "dot_flops": got["dot_flops"], "unresolved_loops": got["unresolved_loops"],
                              **{f"excess_{k}": v for k, v in parts.items()},
                              "xla_lowered_flops": got["xla_lowered"], "xla_check": round(got["xla_check"], 6),
                              **kernels})
