"""The model side of a run, built once from the config: mesh, parameters, tokenizer, samplers
and the compiled train step (`build_job`). Every workload trains with a `Job`."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp

from jaxscaffold import config as config_lib
from jaxscaffold import seeds
from jaxscaffold.config import RunConfig
from jaxscaffold.models import hf_io, hub, qwen3
from jaxscaffold.models import lora as lora_lib
from jaxscaffold.models.sharding import make_mesh, maybe_initialize_distributed
from jaxscaffold.models.tokenizer import load_tokenizer
from jaxscaffold.rl.train_step import init_train_state, state_shardings
from jaxscaffold.rollout.engine import Sampler
from jaxscaffold.train.job_spec import (JobSpec, base_dtype, correction, lora_config,  # noqa: F401 (for callers)
                                        model_config, optimizer_config, split_pod)
from jaxscaffold.train.vocabularies import word_tokenizer


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
    lora: Any = None  # a `models.lora.LoraConfig` when the state trains LoRA adapters (then the reference is the base)
    base_params: Any = None  # LoRA: the frozen base the adapters merge into
    spec: JobSpec | None = None  # what the job was built from

    @property
    def frozen(self):
        """The train step's frozen argument: LoRA's base, the KL reference, or None (neither):
        every update calls `train_step(state, batch, job.frozen)`."""
        return self.base_params if self.lora is not None else self.ref_params

    def policy_params(self, params):
        """The parameters the samplers decode with, of the state's `params`: themselves, or
        with LoRA the base merged with these adapters (call once per update)."""
        if self.lora is None:
            return params
        return lora_lib.merged(self.model_config, self.base_params, params, self.lora)


def build_model(cfg: RunConfig, mesh):
    """(model config, params) from an HF directory, or a random init of a preset."""
    m = cfg.model
    if m.hf_path:
        return hf_io.load_pretrained(hub.resolve(m.hf_path), dtype=base_dtype(cfg), mesh=mesh, compute_dtype=m.compute_dtype,
                                     scan_layers=m.scan_layers, remat_policy=m.remat_policy)
    config = model_config(cfg)
    return config, qwen3.init_params(config, jax.random.key(seeds.derive(cfg.seed, "init")), mesh=mesh)


def tokenizer_path(m) -> str | None:
    """The configured tokenizer dir; else the checkpoint's own, if it has one; else None (offline)."""
    if m.tokenizer:
        return hub.resolve(m.tokenizer, "model.tokenizer")
    if m.hf_path and os.path.exists(os.path.join(hub.resolve(m.hf_path), "tokenizer_config.json")):
        return hub.resolve(m.hf_path)
    return None


def run_tokenizer(m):
    """The run's tokenizer: the word-level one of `model.vocabulary`, else `tokenizer_path`'s."""
    return word_tokenizer(m.vocabulary) if m.vocabulary else load_tokenizer(tokenizer_path(m))


def mesh_devices(cfg) -> list | None:
    """`config.mesh.devices`: the first n devices (None: all of them)."""
    n = cfg.mesh.devices
    if not n or n == jax.device_count():
        return None
    if jax.process_count() > 1 or not 0 < n <= jax.device_count():
        raise ValueError(f"config.mesh.devices={n}: a subset of the devices needs 1 <= n <= "
                         f"{jax.device_count()} and one process (have {jax.process_count()})")
    return jax.devices()[:n]


def split_devices(cfg) -> tuple[list | None, list | None]:
    """(the training mesh's devices, the samplers' devices): `mesh_devices` and None, or with
    `mesh.rollout_devices = r` the run's devices split: on each of the P processes (hosts) the
    last r / P of its devices sample, the others of every process train (one training mesh
    across the hosts; each host's rollouts stay on its own devices, docs/async_training.md)."""
    r = cfg.mesh.rollout_devices
    if not r:
        return mesh_devices(cfg), None
    devices = mesh_devices(cfg) or jax.devices()
    return split_pod(devices, [d.process_index for d in devices], r)


def build_job(cfg) -> tuple[Job, Any]:
    """The `Job` of `cfg` and the initial train state (parameters and optimizer state, sharded
    over the mesh): `JobSpec.from_config(cfg)` materialized. Starts JAX's multi-controller
    runtime first where the environment asks."""
    maybe_initialize_distributed()
    cfg = config_lib.typed(cfg)
    spec = JobSpec.from_config(cfg)
    train_devices, rollout_devices = split_devices(cfg)
    mesh = make_mesh(spec.mesh, train_devices)
    model_config, params = build_model(cfg, mesh)
    # The checkpoint's tensors can refine what its config.json says (a Qwen3Model saved without
    # the "model." prefix is an embedding model): the loaded config is the one that runs.
    spec = dataclasses.replace(spec, model=model_config)
    tokenizer = run_tokenizer(cfg.model)
    opt = spec.optimizer.make()
    step_fn = spec.train_step(mesh=mesh)
    shardings = state_shardings(model_config, opt, mesh, lora=spec.lora)
    base_params = None
    if spec.lora is not None:  # LoRA: the state trains the adapters; the base is frozen (and the reference)
        base_params = params
        params = lora_lib.init_adapters(model_config, spec.lora, jax.random.key(seeds.derive(spec.seed, "lora")),
                                        mesh=mesh, dtype=spec.adapter_dtype)
    # The reference is a copy (the state's parameters are donated to each step).
    ref_params = jax.tree.map(jnp.copy, params) if spec.reference_copy else None
    state = jax.device_put(init_train_state(params, opt), shardings)
    # On several processes each samples on its own devices (tensor parallel; `rollout_mesh`); a
    # split pod on its rollout devices.
    sampler_mesh, sampler_rules = spec.rollout_mesh(mesh, rollout_devices)
    sampler = spec.sampler.build(model_config, mesh=sampler_mesh, rules=sampler_rules, stop_ids=tokenizer.eos_ids)
    eval_sampler = spec.eval_sampler.build(model_config, mesh=sampler_mesh, rules=sampler_rules,
                                           stop_ids=tokenizer.eos_ids)
    job = Job(cfg, mesh, model_config, tokenizer, sampler, eval_sampler, step_fn, spec.algo,
              row_multiple=spec.row_multiple(mesh), ref_params=ref_params, lora=spec.lora,
              base_params=base_params, spec=spec)
    return job, state
