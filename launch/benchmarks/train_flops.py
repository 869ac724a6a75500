"""Train-step FLOPs as compiled: XLA's flop count of one optimizer step at Qwen3-4B shapes and
FEE's batch (16 tasks x 8 rollouts, 16,384-token rows), per remat policy, against the textbook
count 6 x matmul parameters x tokens (forward 2, backward 4) plus causal attention
(forward 2 T^2 H K per layer and row for the causal half, x 3 with its backward).

Nothing runs: each step is lowered for abstract arguments and compiled on CPU for its cost
analysis. XLA counts a loop's body once, whatever its trip count, so the counted step has its
layers unrolled (`scan_layers=False`), one logprob chunk and one micro-batch: the same
arithmetic as the scanned program a run compiles. What the ratio shows: recompute (full remat runs the forward twice: 8 instead of 6 per
parameter and token), the causal query blocks of the XLA attention (they read 36/64 of the
score matrix at 8 blocks, not the ideal half), and the vocabulary projection of the scored
positions. `--quick` uses a 2-layer model and 1,024-token rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from benchmarks.common import REPORT
from jaxscaffold.backends.accelerator import Accelerator
from jaxscaffold.models import config as model_configs
from jaxscaffold.models import qwen3
from jaxscaffold.rl.presets import preset
from jaxscaffold.rl.train_step import BATCH_AXES, OptimizerConfig, init_train_state, make_train_step

POLICIES = ("none", "full", "save_dots")


def textbook_flops(c, rows: int, length: int, scored: int) -> dict[str, float]:
    """6 N T for the layers' matmuls, 6 V D for each scored position, causal attention x 3."""
    d, k = c.hidden_size, c.head_dim
    per_layer = d * (c.num_heads + 2 * c.num_kv_heads) * k + c.num_heads * k * d + 3 * d * c.intermediate_size
    tokens = rows * length
    layers = 6 * c.num_layers * per_layer * tokens
    head = 6 * c.vocab_size * d * rows * scored
    attention = 3 * 2 * length * length * c.num_heads * k * c.num_layers * rows  # 2 matmuls x 2 flops x T^2/2
    return {"layers": layers, "lm_head": head, "attention": attention, "total": layers + head + attention}


def compiled_flops(c, rows: int, length: int, scored: int) -> float:
    opt = OptimizerConfig()
    step = make_train_step(c.replace(scan_layers=False), preset("grpo"), opt, logprob_chunk=length,
                           backend=Accelerator())  # the accelerators' program (autodiff dense layers)
    state = jax.eval_shape(lambda p: init_train_state(p, opt.make()), qwen3.param_shapes(c))
    ints = ("tokens_BT", "segment_ids_BT", "loss_mask_BT")
    batch = {name: jax.ShapeDtypeStruct((rows, length)[: len(axes)], jnp.int32 if name in ints else jnp.float32)
             for name, axes in BATCH_AXES.items()}
    positions = None if scored >= length else scored
    return float(step.lower(state, batch, num_positions=positions).compile().cost_analysis()["flops"])


def expected_flops(c, rows: int, length: int, scored: int, policy: str) -> float:
    """What the implementation should cost: the textbook terms, the vocabulary projection
    recomputed in its backward (logprobs are chunked under remat: 8 V D instead of 6), causal
    blocks reading 36/64 of the scores (8 query blocks) instead of half, and under full remat
    the layers' forward once more (2 N T and the attention's forward)."""
    t = textbook_flops(c, rows, length, scored)
    attention = t["attention"] * (36 / 64) / 0.5
    out = t["layers"] + t["lm_head"] * 8 / 6 + attention
    if policy == "full":
        out += t["layers"] / 3 + attention / 3
    return out


def run(quick: bool = False) -> None:
    rows, length = (8, 1024) if quick else (128, 16384)
    base = model_configs.preset("qwen3-4b", compute_dtype="bfloat16", param_dtype="float32")
    if quick:
        base = base.replace(num_layers=2)
    ref = textbook_flops(base, rows, length, length)
    REPORT.say(f"# Qwen3-4B shapes ({base.num_layers} layers), {rows} rows x {length} tokens; textbook (all positions "
               f"scored): layers {ref['layers']:.3g}, lm_head {ref['lm_head']:.3g}, attention {ref['attention']:.3g}")
    # FEE's turns (15 x 2,048 tokens) can fill a row, so every position is scored; the last
    # figure scores one turn's worth (2,048 positions a row) to show what masked scoring saves.
    cases = [(policy, length) for policy in POLICIES] + [("full", length // 8)]
    for policy, scored in cases:
        flops = compiled_flops(base.replace(remat_policy=policy), rows, length, scored)
        textbook = textbook_flops(base, rows, length, scored)["total"]
        expected = expected_flops(base, rows, length, scored, policy)
        REPORT.figure(f"train_step_flops remat={policy} scored={scored}", flops / 1e12, "TFLOP",
                      ratio=flops / textbook, note=f"(vs 6NT + attention; {flops / expected:.3f} of the expected "
                                                   "count with recompute and causal blocks)")
