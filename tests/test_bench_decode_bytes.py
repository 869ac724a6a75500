"""`launch/bench.py decode_bytes`: its per-op byte count (launch/benchmarks/hlo_bytes.py)
reproduces XLA's cost analysis when unchanged and counts loops and slices as stated; the
windowed stacked decode reads less than the full-capacity one."""

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
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
    # Fused, tanh is a fusion of its own (it feeds the next layer's dot): the same bytes, and
    # the views of the weights (the scan's dynamic slice, then a slice) are still read in place.
    fused = hlo_bytes.bytes_accessed(text, loops=True, fusion=True)
    assert fused.by_opcode["dot"] == counted.by_opcode["dot"] and fused.total <= counted.total


def test_quick_decode_bytes_windowed_below_full():
    run = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "bench.py"), "decode_bytes", "--quick", "--json"],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    everything = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    figures = [f for f in everything if f["program"] in ("windowed", "full")]
    by = {(f["filled"], f["program"]): f for f in figures}
    # The rules' replica of XLA's count: XLA takes one transpose (the new keys' axes moved for
    # the cache write, ~0.1% here) for a bitcast.
    assert len(by) == 6 and all(abs(f["xla_check"]) < 1e-2 for f in figures)
    capacity = figures[0]["capacity"]
    for (filled, program), f in by.items():
        assert f["ratio"] == pytest.approx(f["bytes_accessed"] / f["min_bytes"], rel=1e-3)
        assert f["dot_bytes"] >= f["min_bytes"]  # the matmuls read at least the weights and the filled cache
        if filled < capacity and program == "windowed":
            assert f["window"] < capacity and f["ratio"] < by[filled, "full"]["ratio"]
    assert by[capacity, "windowed"]["bytes_accessed"] == by[capacity, "full"]["bytes_accessed"]
    # The mixed batch (half the rows at 1/8, half full): the contiguous step is the full
    # window's; the paged one on TPU reads each row's own pages (less), the gather read of
    # every row's pages up to the longest row's (more).
    mixed = {f["program"]: f for f in everything if f["program"].startswith("mixed_")}
    assert set(mixed) == {"mixed_contiguous", "mixed_paged", "mixed_paged_gather"}
    assert mixed["mixed_contiguous"]["bytes_accessed"] == by[capacity, "windowed"]["bytes_accessed"]
    for program, f in mixed.items():
        assert f[f"{program}_over_min"] == pytest.approx(f["bytes_accessed"] / f["min_bytes"])
    assert mixed["mixed_paged"]["ratio"] < mixed["mixed_contiguous"]["ratio"] < mixed["mixed_paged_gather"]["ratio"]
    assert mixed["mixed_paged"]["read_by_kernel"] < mixed["mixed_paged_gather"]["gather_read"]


def test_a_skipped_scope_counts_nothing_and_the_kernel_reads_own_pages():
    from benchmarks import decode_bytes
    from jaxscaffold.models import config as model_configs
    n = 1000

    @functools.partial(jax.named_call, name="paged_read")
    def read(x):  # a fusion of its own: reads x, writes the sum
        return jnp.sum(jnp.exp(x))

    def net(x, y):  # the dot reads x and y, writes [n, n]
        return read(x) + x[:, None] @ y[None]

    x = jax.ShapeDtypeStruct((n,), jnp.float32)
    text = jax.jit(net).lower(x, x).as_text(dialect="hlo", debug_info=True)
    whole = hlo_bytes.bytes_accessed(text, fusion=True).total
    rest = hlo_bytes.bytes_accessed(text, fusion=True, skip_scope="paged_read").total
    assert whole - rest == 4 * n + 4  # the read's fusion: x in, a scalar out
    # Rows of 1, 64 and 65 tokens in pages of 64 hold 1 + 1 + 2 pages: the kernel moves those
    # (keys and values, bf16), queries and outputs (bf16) and int32 lengths and tables, per layer.
    c = model_configs.tiny()
    got = decode_bytes.kernel_bytes(c, np.array([1, 64, 65]), 64, table_width=4)
    per_layer = 2 * 4 * 64 * c.num_kv_heads * c.head_dim * 2 + 2 * 3 * c.num_heads * c.head_dim * 2 + 4 * 3 * 5
    assert got == c.num_layers * per_layer


def test_loop_fusion_reads_each_input_once_and_materialises_what_a_dot_reads():
    n, f = 1000, 16

    def reduced(x):  # one fusion: reads x, writes the scalar
        return jnp.sum(jnp.exp(x - 1.0) * 2.0)

    def fed_to_a_dot(x, w):  # exp is materialised for the dot: write it, the dot reads it
        return jnp.exp(x)[None] @ w

    x, w = jax.ShapeDtypeStruct((n,), jnp.float32), jax.ShapeDtypeStruct((n, f), jnp.float32)
    text = jax.jit(reduced).lower(x).as_text(dialect="hlo")
    assert hlo_bytes.bytes_accessed(text, fusion=True).total == 4 * n + 4
    assert hlo_bytes.bytes_accessed(text).total > 3 * 4 * n  # unfused: each op reads and writes
    text = jax.jit(fed_to_a_dot).lower(x, w).as_text(dialect="hlo")
    assert hlo_bytes.bytes_accessed(text, fusion=True).total == (4 * n + 4 * n) + (4 * n + 4 * n * f + 4 * f)
