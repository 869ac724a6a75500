"""`launch/bench.py decode_bytes`: its per-op byte count (launch/benchmarks/hlo_bytes.py)
reproduces XLA's cost analysis when unchanged and counts loops and slices as stated; the
windowed stacked decode reads less than the full-capacity one."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "launch"))

from benchmarks import hlo_bytes  # noqa: E402


def test_the_count_follows_xla_and_then_the_loop_and_slice_rules():
    layers, d, f, rows = 4, 64, 96, 8

    def net(w_LDF, x_RD):  # a scan over layers, each reading its slice of the stacked weights
        def layer(h, w):
            return jnp.tanh(h @ w[:, :d]), None
        return jax.lax.scan(layer, x_RD, w_LDF)[0]

    lowered = jax.jit(net).lower(jax.ShapeDtypeStruct((layers, d, f), jnp.float32),
                                 jax.ShapeDtypeStruct((rows, d), jnp.float32))
    text = lowered.as_text(dialect="hlo")
    assert hlo_bytes.bytes_accessed(text).total == pytest.approx(lowered.cost_analysis()["bytes accessed"], rel=1e-3)
    counted = hlo_bytes.bytes_accessed(text, loops=True, fused=True)
    # Per layer, by hand: the dot reads the weight slice [d, d] and h [rows, d], writes [rows, d];
    # tanh reads and writes [rows, d]. Slices count nothing; the loop's counter and its
    # bookkeeping (tuples, a compare) a few bytes.
    per_layer = 4 * (d * d + 2 * rows * d + 2 * rows * d)
    assert counted.by_opcode["dot"] == layers * 4 * (d * d + 2 * rows * d)
    assert per_layer * layers <= counted.total <= per_layer * layers * 1.05


def test_quick_decode_bytes_windowed_below_full():
    run = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "bench.py"), "decode_bytes", "--quick", "--json"],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    figures = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    by = {(f["filled"], f["program"]): f for f in figures}
    assert len(by) == 6 and all(abs(f["xla_check"]) < 1e-3 for f in figures)
    capacity = figures[0]["capacity"]
    for (filled, program), f in by.items():
        assert f["ratio"] == pytest.approx(f["bytes_accessed"] / f["min_bytes"], rel=1e-3)
        assert f["dot_bytes"] >= f["min_bytes"]  # the matmuls read at least the weights and the filled cache
        if filled < capacity and program == "windowed":
            assert f["window"] < capacity and f["ratio"] < by[filled, "full"]["ratio"]
    assert by[capacity, "windowed"]["bytes_accessed"] == by[capacity, "full"]["bytes_accessed"]
