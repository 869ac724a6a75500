"""The model side of a run, built once from the config: mesh, parameters, tokenizer, samplers
and the compiled train step (`build_job`). Every workload trains with a `Job`."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import jax.numpy as jnp

from jaxscaffold import config as config_lib
from jaxscaffold import seeds
from jaxscaffold.config import RunConfig
from jaxscaffold.models import config as model_config_lib
from jaxscaffold.models import hf_io, qwen3
from jaxscaffold.models.sharding import MeshConfig, make_mesh, maybe_initialize_distributed
from jaxscaffold.models.tokenizer import load_tokenizer
from jaxscaffold.rl.presets import preset
from jaxscaffold.rl.train_step import OptimizerConfig, init_train_state, make_train_step, state_shardings
from jaxscaffold.rollout.engine import Sampler
from jaxscaffold.rollout.sampling import GREEDY, SamplingConfig


@dataclasses.dataclass
class Job:
    """The model side of a run, built once from the config: what every workload trains with."""

    cfg: RunConfig
    mesh: Any
    model_config: Any
    tokenizer: Any
    sampler: Sampler  # training rollouts (temperature, group rows)
    eval_sampler: Sampler  # greedy evaluation
    train_step: Any
    algo: Any
    row_multiple: int
    ref_params: Any = None  # frozen reference policy (the initial parameters) when kl_coef > 0


def model_config(cfg: RunConfig) -> model_config_lib.Qwen3Config:
    """The run's architecture and execution options without loading a weight: the checkpoint's
    config.json (`model.hf_path`), else the preset."""
    m = cfg.model
    execution = dict(param_dtype=m.param_dtype, compute_dtype=m.compute_dtype, scan_layers=m.scan_layers,
                     remat_policy=m.remat_policy)
    if m.hf_path:
        path = os.path.join(m.hf_path, "config.json")
        try:
            with open(path) as f:
                hf = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise hf_io.CheckpointError(f"{path}: cannot read the model's config ({e})") from None
        return hf_io.config_from_hf(hf, path, **execution)
    if m.preset == "tiny":
        return model_config_lib.tiny(**execution)
    return model_config_lib.preset(m.preset, **execution)


def build_model(cfg: RunConfig, mesh):
    """(model config, params) from an HF directory, or a random init of a preset."""
    m = cfg.model
    if m.hf_path:
        return hf_io.load_pretrained(m.hf_path, dtype=m.param_dtype, mesh=mesh, compute_dtype=m.compute_dtype,
                                     scan_layers=m.scan_layers, remat_policy=m.remat_policy)
    config = model_config(cfg)
    return config, qwen3.init_params(config, jax.random.key(seeds.derive(cfg.seed, "init")), mesh=mesh)


def tokenizer_path(m) -> str | None:
    """The configured tokenizer dir; else the checkpoint's own, if it has one; else None (offline)."""
    if m.tokenizer:
        return m.tokenizer
    if m.hf_path and os.path.exists(os.path.join(m.hf_path, "tokenizer_config.json")):
        return m.hf_path
    return None


def mesh_devices(cfg) -> list | None:
    """`config.mesh.devices`: the first n devices (None: all of them)."""
    n = cfg.mesh.devices
    if not n or n == jax.device_count():
        return None
    if jax.process_count() > 1 or not 0 < n <= jax.device_count():
        raise ValueError(f"config.mesh.devices={n}: a subset of the devices needs 1 <= n <= "
                         f"{jax.device_count()} and one process (have {jax.process_count()})")
    return jax.devices()[:n]


def optimizer_config(cfg: RunConfig) -> OptimizerConfig:
    """The run's optimizer (its `learning_rate()` schedule is what the logs report)."""
    r = cfg.rl
    return OptimizerConfig(lr=r.lr, weight_decay=r.weight_decay, grad_clip=r.grad_clip, warmup_steps=r.warmup_steps)


def build_job(cfg) -> tuple[Job, Any]:
    """The `Job` of `cfg` and the initial train state (parameters and optimizer state, sharded
    over the mesh). Starts JAX's multi-controller runtime first where the environment asks."""
    maybe_initialize_distributed()
    cfg = config_lib.typed(cfg)
    mesh = make_mesh(MeshConfig(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor), mesh_devices(cfg))
    model_config, params = build_model(cfg, mesh)
    tokenizer = load_tokenizer(tokenizer_path(cfg.model))
    r, c = cfg.rl, cfg.rollout
    algo = preset(r.algorithm, kl_coef=r.kl_coef, entropy_coef=r.entropy_coef)
    opt_config = optimizer_config(cfg)
    opt = opt_config.make()
    data_parallel = mesh.shape["data"] * mesh.shape["fsdp"]
    with_reference = bool(algo.kl_coef)
    # The config (not `opt`) names the optimizer: equal configs share the compiled step.
    step_fn = make_train_step(model_config, algo, opt_config, num_micro_batches=r.micro_batches, mesh=mesh,
                              agg_constant=float(c.max_new_tokens * c.max_turns), with_reference=with_reference)
    shardings = state_shardings(model_config, opt, mesh)
    # The reference is a copy (the state's parameters are donated to each step).
    ref_params = jax.tree.map(jnp.copy, params) if with_reference else None
    state = jax.device_put(init_train_state(params, opt), shardings)
    sampling = SamplingConfig(temperature=c.temperature, top_p=c.top_p)
    # Slots for this process's share of the groups and eval tasks (all of them on one process).
    share = -(-c.tasks_per_step // jax.process_count())
    rows = share * c.group_size
    sampler = Sampler(model_config, batch_size=rows, max_len=c.max_len, sampling=sampling,
                      cache_dtype=cfg.model.cache_dtype)
    eval_rows = min(rows, max(1, -(-cfg.eval.tasks // jax.process_count())))
    eval_sampler = Sampler(model_config, batch_size=eval_rows, max_len=cfg.eval.max_len or c.max_len,
                           sampling=GREEDY, cache_dtype=cfg.model.cache_dtype)
    job = Job(cfg, mesh, model_config, tokenizer, sampler, eval_sampler, step_fn, algo,
              row_multiple=r.micro_batches * data_parallel, ref_params=ref_params)
    return job, state
