"""`launch/bench.py train_flops`: its per-op flop count (launch/benchmarks/train_flops.py)
reproduces XLA's cost analysis when loops count once, counts a loop body per trip otherwise,
and on a small train step equals the matmul flops computed by hand, without remat and with
full remat (~4/3)."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "launch"))

from benchmarks import train_flops  # noqa: E402
from jaxscaffold.models import config as model_configs  # noqa: E402


def test_xla_counts_a_loop_body_once_and_the_count_per_trip():
    layers, d, rows = 6, 64, 8

    def net(w_LDD, x_RD):
        return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w) * 2.0, None), x_RD, w_LDD)[0]

    lowered = jax.jit(net).lower(jax.ShapeDtypeStruct((layers, d, d), jnp.float32),
                                 jax.ShapeDtypeStruct((rows, d), jnp.float32))
    text = lowered.as_text(dialect="hlo")
    per_layer_dot = 2 * rows * d * d
    xla = lowered.cost_analysis()["flops"]
    assert train_flops.hlo_flops(text).total == pytest.approx(xla, rel=1e-6)
    # XLA: one trip's dot (and its multiply, tanh being a transcendental), plus the counter.
    assert per_layer_dot <= xla < 1.1 * per_layer_dot
    assert per_layer_dot <= lowered.compile().cost_analysis()["flops"] < 1.1 * per_layer_dot  # compiled: the same
    counted = train_flops.hlo_flops(text, loops=True, live_only=True)
    assert counted.by_opcode["dot"] == layers * per_layer_dot
    assert counted.by_opcode["multiply"] == layers * rows * d and counted.unresolved_loops == 0


def test_a_loop_bounded_by_another_loops_counter_is_flagged():
    def triangle(x):  # inner trips 1..4: a bound no constant states
        return jax.lax.fori_loop(0, 4, lambda i, a: jax.lax.fori_loop(0, i + 1, lambda j, b: b * 2.0, a), x)

    text = jax.jit(triangle).lower(jax.ShapeDtypeStruct((16,), jnp.float32)).as_text(dialect="hlo")
    counted = train_flops.hlo_flops(text, loops=True)
    assert counted.unresolved_loops == 1 and counted.by_opcode["multiply"] == 4 * 16  # not the 10 x 16 it runs


def _step_dots(config, rows, length):
    cfg, _, _, _, _, _ = train_flops.fee_config(quick=True)
    got = train_flops.step_flops(cfg, config, rows, length, length)
    assert abs(got["xla_check"]) < 1e-3  # the rules' replica of XLA's lowered count
    return got


def test_small_train_step_equals_the_hand_count():
    layers, d, f, h, g, k, v = 2, 128, 384, 4, 2, 32, 1024
    rows, t = 2, 256  # 8 query blocks of 32 tokens
    config = model_configs.tiny(vocab_size=v, hidden_size=d, intermediate_size=f, num_layers=layers, num_heads=h,
                                num_kv_heads=g, head_dim=k, compute_dtype="bfloat16", param_dtype="float32")
    tokens = rows * t
    # By hand, forward per token: the projections 2 x (q, k, v, o, gate, up, down); attention
    # 2 x 2 H K per key, over 36/64 of the T^2 pairs (blocks j = 1..8 of 32 queries reading 32 j
    # keys); the unembedding 2 V D on every (scored) position.
    proj = 2 * layers * (d * h * k + 2 * d * g * k + h * k * d + 3 * d * f) * tokens
    down = 2 * layers * d * f * tokens
    attn = 2 * 2 * h * k * layers * rows * sum(32 * 32 * j for j in range(1, 9))
    head = 2 * v * d * tokens
    # Backward twice the forward; the logprob chunks recompute the unembedding (checkpointed).
    none = _step_dots(config, rows, t)
    assert none["dot_flops"] == pytest.approx(3 * (proj + attn) + 4 * head, rel=1e-3)
    assert none["flops"] == pytest.approx(none["dot_flops"], rel=0.05)  # the rest: element-wise
    # Full remat: the layers' forward once more, but for the down projection (its output is
    # not read by the backward): ~4/3 of the layers' matmuls.
    full = _step_dots(config.replace(remat_policy="full"), rows, t)
    assert full["dot_flops"] == pytest.approx(4 * (proj + attn) - down + 4 * head, rel=1e-3)
    layers_ratio = (full["dot_flops"] - 4 * head) / (none["dot_flops"] - 4 * head)
    assert 1.25 < layers_ratio < 4 / 3
    # And the bench's own decomposition explains every matmul flop.
    for policy, got in (("none", none), ("full", full)):
        excess = train_flops.excess_terms(config, rows, t, t, policy)
        explained = train_flops.reference_flops(config, rows, t, t)["total"] + sum(excess.values())
        assert got["dot_flops"] == pytest.approx(explained, rel=1e-3)


def test_quick_train_flops_json():
    run = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "bench.py"), "train_flops", "--quick", "--json"],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    figures = {f["policy"] + str(f["scored"]): f for f in map(json.loads, run.stdout.splitlines()) if "policy" in f}
    assert len(figures) == 4
    for f in figures.values():
        assert abs(f["xla_check"]) < 1e-3 and abs(f["excess_other_dots"]) < 1e-3 * f["reference_flops"]
        assert f["unresolved_loops"] == 0
        assert f["flops"] > f["xla_lowered_flops"]  # XLA's count takes each loop body once
    none, full, dots = figures["none1024"], figures["full1024"], figures["save_dots1024"]
    assert none["ratio"] < dots["ratio"] < full["ratio"]
    assert figures["full128"]["flops"] < full["flops"]  # masked scoring: the head on fewer positions


def test_the_compiled_step_keeps_the_count():
    # Layers unrolled and one logprob chunk: no loop trips for the compiled count to miss.
    # XLA:CPU's compile adds element-wise work of its own (bf16 widened around dots) but
    # keeps every matmul, the remat recompute included (optimisation barriers).
    config = model_configs.tiny(vocab_size=1024, hidden_size=128, intermediate_size=384, head_dim=32,
                                compute_dtype="bfloat16", remat_policy="full", scan_layers=False)
    cfg, _, _, _, _, _ = train_flops.fee_config(quick=True)
    lowered = train_flops.lowered_step(cfg, config, 2, 256, 256)
    counted = train_flops.hlo_flops(lowered.as_text(dialect="hlo"), loops=True, live_only=True)
    compiled = lowered.compile().cost_analysis()["flops"]
    assert counted.total < compiled < 1.1 * counted.total
