"""`JobSpec`: the job described once. `build_job`, `memory_plan.plan` and the train-step FLOP
count build the optimizer, algorithm, reference, LoRA and samplers from the one spec of a
config, and a config change reaches all three."""

import os
import sys

import jax
import pytest

from jaxscaffold import config as config_lib
from jaxscaffold.rl.presets import PRESETS
from jaxscaffold.train import memory_plan
from jaxscaffold.train.job import build_job
from jaxscaffold.train.job_spec import JobSpec
from jaxscaffold.train.waves import sampler_rows

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "launch"))

from benchmarks import train_flops  # noqa: E402

# The user's configs with the tiny model and short rows (everything else as written).
SMALL = ("model.preset=tiny", "model.hf_path=", "rollout.max_len=256", "rollout.max_new_tokens=32",
         "eval.max_len=0", "mesh.devices=1")


def small(name, *overrides):
    cd = config_lib.load_file(os.path.join(ROOT, "configs", f"{name}.py"))
    return config_lib.from_configdict(config_lib.parse_overrides(cd, [*SMALL, *overrides]))


def consumers(cfg):
    """What each consumer built: the job, the memory plan (one device) and the lowered step of
    the FLOP count (2 rows of 64 tokens)."""
    job, _ = build_job(cfg)
    plan = memory_plan.plan(cfg, hbm_bytes=16e9, devices=jax.devices()[:1], compile_step=False)
    lowered = train_flops.lowered_step(cfg, JobSpec.from_config(cfg).model, 2, 64, 64)
    return job, plan, lowered


def frozen_args(lowered) -> int:
    """The step's arguments after (state, batch): the reference, or LoRA's frozen base."""
    return len(lowered.args_info[0]) - 2


@pytest.mark.parametrize("name", ["fee", "rwml", "colab"])
def test_the_spec_reads_the_config(name):
    cfg = small(name, "rl.overlong_buffer=128")
    spec = JobSpec.from_config(cfg, processes=1)
    r, c = cfg.rl, cfg.rollout
    assert (spec.optimizer.lr, spec.optimizer.weight_decay, spec.optimizer.grad_clip, spec.optimizer.warmup_steps) \
        == (r.lr, r.weight_decay, r.grad_clip, r.warmup_steps)
    preset = PRESETS[r.algorithm]
    assert spec.algo.name == preset.name and spec.algo.clip_low == preset.clip_low
    assert (spec.algo.kl_coef, spec.algo.entropy_coef) == (r.kl_coef, r.entropy_coef)
    assert spec.algo.overlong_buffer == 128  # the run's override, not the preset's
    assert spec.agg_constant == c.max_new_tokens * c.max_turns
    assert (spec.correction.tis_cap, spec.correction.mis) == (r.tis_cap, r.mis)
    assert (spec.lora is None) == (cfg.lora.rank == 0)
    if spec.lora is not None:
        assert (spec.lora.rank, spec.lora.alpha) == (cfg.lora.rank, cfg.lora.alpha)
        assert spec.model.param_dtype == cfg.lora.base_dtype and spec.adapter_dtype == cfg.model.param_dtype
    assert spec.sampler.batch_size == sampler_rows(c, c.tasks_per_step)
    assert (spec.sampler.max_len, spec.sampler.options.sampling.temperature) == (c.max_len, c.temperature)
    assert spec.eval_sampler.options.sampling.temperature == 0.0 and spec.eval_sampler.max_len == c.max_len
    assert spec.reference_copy == (bool(r.kl_coef) and spec.lora is None)
    assert JobSpec.from_config(cfg, processes=1) == spec  # pure: equal configs, equal specs


@pytest.mark.parametrize("name", ["fee", "rwml", "colab"])
def test_the_three_consumers_build_one_spec(name):
    cfg = small(name)
    spec = JobSpec.from_config(cfg)
    job, plan, lowered = consumers(cfg)
    # build_job
    assert job.spec == spec and job.algo == spec.algo and job.lora == spec.lora
    for sampler, want in ((job.sampler, spec.sampler), (job.eval_sampler, spec.eval_sampler)):
        assert (sampler.batch_size, sampler.max_len, sampler.sampling, sampler.cache_dtype) == \
            (want.batch_size, want.max_len, want.options.sampling, want.options.cache_dtype)
    assert (job.ref_params is not None) == spec.reference_copy
    # the step's frozen argument: LoRA's base, the KL reference or nothing
    assert (job.frozen is not None) == (spec.with_reference or spec.lora is not None)
    # the memory plan: the state it counts is the spec's (adapters and a frozen base with LoRA)
    trained = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(spec.trained_shapes()))
    assert plan.params == trained
    assert (plan.reference > 0) == spec.reference_copy and (plan.frozen_base > 0) == (spec.lora is not None)
    # the FLOP count's step: the same trained state and frozen argument
    state = lowered.args_info[0][0]
    assert jax.tree.structure(state.params) == jax.tree.structure(spec.trained_shapes())
    assert frozen_args(lowered) == int(spec.with_reference or spec.lora is not None)


def test_a_config_change_reaches_all_three():
    before = consumers(small("fee"))
    after = consumers(small("fee", "rl.kl_coef=0.01", "rl.lr=3e-6", "rollout.max_len=512"))
    (job0, plan0, lowered0), (job1, plan1, lowered1) = before, after
    # the KL reference: a copy of the parameters in the job, its bytes in the plan, an argument of the counted step
    assert job0.ref_params is None and job1.ref_params is not None and job1.algo.kl_coef == 0.01
    assert plan0.reference == 0 and plan1.reference == plan1.params
    assert (frozen_args(lowered0), frozen_args(lowered1)) == (0, 1)
    # the optimizer and the samplers' context
    assert job1.spec.optimizer.lr == 3e-6 and job1.sampler.max_len == 512
    # the plan's cache grows by K and V (bf16) for the 256 slots added to each row (plus at most a
    # position per slot)
    c, rows = job1.model_config, job1.spec.sampler.batch_size
    kv = 2 * c.num_layers * rows * 256 * c.num_kv_heads * c.head_dim * 2
    assert kv <= plan1.kv_cache - plan0.kv_cache <= kv + rows * 256 * 4
