"""The memory plan of a LoRA run: the adapters (and their moments) as the trained state, the
frozen base in its own dtype, the merged copy the samplers decode with."""

import jax
import pytest

from jaxscaffold.models import config as model_configs
from jaxscaffold.train import memory_plan
from tests.train.test_memory_plan import param_count, tiny


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
