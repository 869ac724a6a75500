"""Memory plans: exact byte counts of the placed arrays, and the compiled step's temporaries; for
full fine-tuning and for LoRA (the adapters and their moments as the trained state, the frozen
base in its own dtype, the merged copy the samplers decode with)."""

import json
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxscaffold import config as config_lib
from jaxscaffold.models import config as model_configs
from jaxscaffold.train import memory_plan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny(*overrides):
    cd = config_lib.load_file(os.path.join(ROOT, "configs", "tiny.py"))
    return config_lib.from_configdict(config_lib.parse_overrides(cd, list(overrides)))


def param_count(c):
    per_layer = (c.hidden_size * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim + c.num_heads * c.head_dim * c.hidden_size
                 + 3 * c.hidden_size * c.intermediate_size + 2 * c.hidden_size + 2 * c.head_dim)
    embed = c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
    return c.num_layers * per_layer + embed + c.hidden_size


def test_state_and_cache_bytes_equal_their_formulas():
    cfg = tiny("mesh.data=1", "mesh.fsdp=4", "mesh.tensor=2")
    p = memory_plan.plan(cfg, hbm_bytes=16e9, devices=jax.devices()[:8], compile_step=False)
    c = model_configs.tiny()
    n = param_count(c)
    # Sharded over 8 devices; a few small arrays (norms) stay replicated, so between n/8 and n/8 + norms.
    assert 4 * n / 8 <= p.params <= 4 * (n / 8 + c.num_layers * 4 * c.hidden_size + c.hidden_size)
    assert p.opt_state == pytest.approx(2 * p.params, abs=64)  # Adam's two moments, plus counters
    assert p.grads == p.params and p.activations is None and p.reference == 0
    rows = cfg.rollout.tasks_per_step * cfg.rollout.group_size
    kv = 2 * c.num_layers * rows * cfg.rollout.max_len * c.num_kv_heads * c.head_dim * 4  # f32 cache (tiny.py)
    assert kv <= p.kv_cache <= kv + rows * (cfg.rollout.max_len * 4 + 64) + rows * c.vocab_size * 4


def test_activations_come_from_the_compiled_step_and_shrink_with_micro_batches():
    one = memory_plan.plan(tiny("mesh.devices=1"), hbm_bytes=16e9, devices=jax.devices()[:1])
    four = memory_plan.plan(tiny("mesh.devices=1", "rl.micro_batches=4"), hbm_bytes=16e9, devices=jax.devices()[:1])
    assert one.activations > four.activations > 0
    assert one.fits() and one.peak == max(one.train_peak, one.rollout_peak)
    small = memory_plan.plan(tiny("mesh.devices=1"), hbm_bytes=one.train_peak / 2, devices=jax.devices()[:1])
    advice = " ".join(small.advice(tiny("mesh.devices=1")))
    assert not small.fits() and "train phase" in advice and "micro_batches" in advice


def test_worst_case_batch():
    cfg = tiny("rollout.max_turns=3", "rollout.max_new_tokens=20", "rollout.max_len=200")
    assert memory_plan.worst_case_batch(cfg) == (32, 256, 64)  # 3 x 20 trained tokens -> the 64 bucket


@pytest.mark.slow
def test_plan_cli_prints_json_and_exits_by_the_verdict():
    cmd = [sys.executable, os.path.join(ROOT, "launch", "plan.py"), "--config", "tiny.py", "--devices", "2", "--json"]
    env = {**os.environ, "XLA_FLAGS": os.environ["JAXSCAFFOLD_TEST_XLA_FLAGS"]}  # (plan.py adds its devices)
    out = subprocess.run(cmd + ["--hbm-gb", "16"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout.strip().splitlines()[-1])
    assert d["devices"] == 2 and d["fits"] and d["advice"] == []
    out = subprocess.run(cmd + ["--hbm-gb", "0.01"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 1 and not json.loads(out.stdout.strip().splitlines()[-1])["fits"]
    out = subprocess.run(cmd + ["--config.rl.algorithm=ppo"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2 and out.stderr.strip().startswith("error: config.rl.algorithm='ppo'")


def test_rows_that_fit_with_pages_and_with_contiguous_slots():
    """The paged pool's bytes are its pages'; the rows the KV memory left holds: max_len slots a
    contiguous row, whole pages of the filled tokens a paged row."""
    cfg = tiny("mesh.devices=1", "rollout.kv_cache=paged", "rollout.page_size=16", "rollout.kv_pages=101")
    p = memory_plan.plan(cfg, hbm_bytes=1e9, devices=jax.devices()[:1], compile_step=False)
    c, max_len = model_configs.tiny(), cfg.rollout.max_len
    token = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 4  # f32 cache (tiny.py)
    rows = cfg.rollout.tasks_per_step * cfg.rollout.group_size
    pool = 101 * 16 * token
    assert pool <= p.kv_cache <= pool + rows * (4 * (-(-max_len // 16) + 1) + 4 * c.vocab_size)  # tables, logits
    assert p.kv_token_bytes == token
    room = 1e9 - (p.rollout_peak - p.kv_cache)
    fit = p.rows_that_fit()
    assert fit == {"contiguous": int(room // (max_len * token)),
                   "paged_fill_1/2": int(room // (-(-max_len // 2 // 16) * 16 * token)),
                   "paged_fill_1/8": int(room // (-(-max_len // 8 // 16) * 16 * token))}
    assert fit["paged_fill_1/8"] > fit["paged_fill_1/2"] > fit["contiguous"] > 0
    assert "rows_that_fit" in p.table() and p.to_dict()["rows_that_fit"] == fit


def test_lora_plan_counts_adapters_base_and_merge():
    c = model_configs.tiny()
    full = memory_plan.plan(tiny("mesh.devices=1"), hbm_bytes=16e9, devices=jax.devices()[:1], compile_step=False)
    p = memory_plan.plan(tiny("mesh.devices=1", "lora.rank=8", "lora.targets=q,v,down", "lora.base_dtype=bfloat16"),
                         hbm_bytes=16e9, devices=jax.devices()[:1])
    d, f, r, n = c.hidden_size, c.intermediate_size, 8, c.num_layers
    adapters = n * r * ((d + c.q_dim) + (d + c.kv_dim) + (f + d))  # a [in, r] + b [r, out] of q, v, down
    assert p.params == 4 * adapters == p.grads and p.opt_state == pytest.approx(2 * p.params, abs=64)
    assert p.frozen_base == 2 * param_count(c) == full.params // 2  # bf16 base, f32 full fine-tuning
    assert p.reference == 0 and p.activations > 0
    merged = 4 * n * d * (c.q_dim + c.kv_dim + f)  # the adapted matrices in f32 (tiny.py computes in f32)
    assert p.sampler_weights == full.sampler_weights + merged
    assert p.state == p.params + p.opt_state + p.frozen_base < full.state / 4


def test_several_processes_hold_the_collectors_copies_in_the_samplers_layout():
    """On P processes each samples its share of the groups on its own devices, and with
    rollout.max_staleness = k the collector holds k + 1 versions in the samplers' layout: k more
    copies of the sampler's weights than a synchronous run (one is the weights it decodes with),
    where one process holds k + 1 copies in the training layout."""
    c, n = model_configs.tiny(), param_count(model_configs.tiny())
    base = ("mesh.devices=0", "mesh.data=1", "mesh.fsdp=-1", "rollout.tasks_per_step=4", "rollout.group_size=2",
            "rollout.max_staleness=2")

    def plan(processes, *overrides):
        return memory_plan.plan(tiny(*base, *overrides), hbm_bytes=16e9, devices=jax.devices()[:8],
                                compile_step=False, hosts=processes)

    one, two = plan(1), plan(2, "rollout.sampler_devices=1")
    assert one.published == 3 * one.params  # f32 master weights, fsdp over 8: three training-layout copies
    # A host sampling on one device holds the whole model per copy (f32), exactly.
    assert two.hosts == 2 and two.sampler_weights == 4 * n and two.published == 2 * 4 * n
    assert two.train_peak == two.state + two.grads + 3 * 4 * n + two.kv_cache  # overlapped: both phases at once
    assert two.rollout_peak == two.state + 3 * 4 * n + two.kv_cache
    # Each process caches its share of the rows: half the one-process sampler's 8.
    max_len = tiny().rollout.max_len
    kv = 2 * c.num_layers * 4 * max_len * c.num_kv_heads * c.head_dim * 4  # 4 rows, f32 cache (tiny.py)
    assert kv <= two.kv_cache <= kv + 4 * (max_len * 4 + 64) + 4 * c.vocab_size * 4
    # A host of 4 devices: each copy tensor parallel over them (norms replicated).
    four = plan(2)
    assert four.published == 2 * four.sampler_weights
    assert 4 * n / 4 <= four.sampler_weights <= 4 * (n / 4 + c.num_layers * 4 * c.hidden_size + c.hidden_size)
    assert plan(2, "rollout.max_staleness=0").published == 0
    with pytest.raises(ValueError, match="8 devices do not split evenly over 3 hosts"):
        plan(3)
