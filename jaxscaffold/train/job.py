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
from jaxscaffold.models import hf_io, hub, qwen3
from jaxscaffold.models import lora as lora_lib
from jaxscaffold.models.local_mesh import local_mesh, local_rules
from jaxscaffold.models.sharding import MeshConfig, make_mesh, maybe_initialize_distributed
from jaxscaffold.models.tokenizer import load_tokenizer
from jaxscaffold.models.word_tokenizer import padded_vocab_size
from jaxscaffold.rl.losses import Correction
from jaxscaffold.rl.presets import preset
from jaxscaffold.rl.train_step import OptimizerConfig, init_train_state, make_train_step, state_shardings
from jaxscaffold.rollout.engine import Sampler
from jaxscaffold.rollout.sampling import GREEDY, SamplingConfig
from jaxscaffold.train.multihost import rollout_mesh
from jaxscaffold.train.waves import sampler_rows
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
    base_params: Any = None  # LoRA: the frozen base the adapters merge into (bound into `train_step`)

    def policy_params(self, params):
        """The parameters the samplers decode with, of the state's `params`: themselves, or
        with LoRA the base merged with these adapters (call once per update)."""
        if self.lora is None:
            return params
        return lora_lib.merged(self.model_config, self.base_params, params, self.lora)


def lora_config(lo: config_lib.Lora | None) -> lora_lib.LoraConfig | None:
    """The adapters of a run's `lora` section (None: full fine-tuning; configs written before
    LoRA have no section)."""
    if lo is None or lo.rank == 0:
        return None
    return lora_lib.LoraConfig(rank=lo.rank, alpha=lo.alpha, targets=lo.target_names())


def model_config(cfg: RunConfig) -> model_config_lib.Qwen3Config:
    """The run's architecture and execution options without loading a weight: the checkpoint's
    config.json (`model.hf_path`), else the preset. With LoRA the parameters are the frozen
    base, in `lora.base_dtype`."""
    m = cfg.model
    execution = dict(param_dtype=base_dtype(cfg), compute_dtype=m.compute_dtype, scan_layers=m.scan_layers,
                     remat_policy=m.remat_policy)
    if m.hf_path:
        path = os.path.join(hub.resolve(m.hf_path), "config.json")
        try:
            with open(path) as f:
                hf = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise hf_io.CheckpointError(f"{path}: cannot read the model's config ({e})") from None
        return hf_io.config_from_hf(hf, path, **execution)
    if m.vocabulary:  # a from-scratch model on a testbed's words: the embedding sized to them
        execution["vocab_size"] = padded_vocab_size(word_tokenizer(m.vocabulary))
    if m.preset == "tiny":
        return model_config_lib.tiny(**execution)
    return model_config_lib.preset(m.preset, **execution)


def base_dtype(cfg: RunConfig) -> str:
    """The dtype the model's parameters are stored in: the master weights' (model.param_dtype),
    or with LoRA the frozen base's (lora.base_dtype)."""
    return cfg.lora.base_dtype if lora_config(cfg.lora) is not None else cfg.model.param_dtype


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
    `mesh.rollout_devices = r` the run's devices split, the last r sampling, the others training."""
    r = cfg.mesh.rollout_devices
    if not r:
        return mesh_devices(cfg), None
    devices = mesh_devices(cfg) or jax.devices()
    if jax.process_count() > 1 or not 0 < r < len(devices):
        raise ValueError(f"config.mesh.rollout_devices={r}: a split needs 1 <= n < {len(devices)} (the run's "
                         f"devices) and one process (have {jax.process_count()})")
    return devices[:-r], devices[-r:]


def optimizer_config(cfg: RunConfig) -> OptimizerConfig:
    """The run's optimizer (its `learning_rate()` schedule is what the logs report)."""
    r = cfg.rl
    return OptimizerConfig(lr=r.lr, weight_decay=r.weight_decay, grad_clip=r.grad_clip, warmup_steps=r.warmup_steps)


def correction(cfg: RunConfig) -> Correction:
    """The run's off-policy correction of sampled tokens (TIS, MIS: `rl.losses.Correction`)."""
    r = cfg.rl
    return Correction(tis_cap=r.tis_cap, mis=r.mis, mis_lo=r.mis_lo, mis_hi=r.mis_hi)


def build_job(cfg) -> tuple[Job, Any]:
    """The `Job` of `cfg` and the initial train state (parameters and optimizer state, sharded
    over the mesh). Starts JAX's multi-controller runtime first where the environment asks."""
    maybe_initialize_distributed()
    cfg = config_lib.typed(cfg)
    train_devices, rollout_devices = split_devices(cfg)
    mesh = make_mesh(MeshConfig(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor), train_devices)
    model_config, params = build_model(cfg, mesh)
    tokenizer = run_tokenizer(cfg.model)
    r, c = cfg.rl, cfg.rollout
    # The run sets DAPO's overlong shaping (rl.overlong_buffer, 0: off), not the preset.
    algo = preset(r.algorithm, kl_coef=r.kl_coef, entropy_coef=r.entropy_coef, overlong_buffer=r.overlong_buffer or None)
    opt_config = optimizer_config(cfg)
    opt = opt_config.make()
    data_parallel = mesh.shape["data"] * mesh.shape["fsdp"]
    with_reference = bool(algo.kl_coef)
    lora = lora_config(cfg.lora)
    # The config (not `opt`) names the optimizer: equal configs share the compiled step.
    step_fn = make_train_step(model_config, algo, opt_config, num_micro_batches=r.micro_batches, mesh=mesh,
                              agg_constant=float(c.max_new_tokens * c.max_turns), with_reference=with_reference,
                              lora=lora, correction=correction(cfg))
    shardings = state_shardings(model_config, opt, mesh, lora=lora)
    base_params = None
    if lora is not None:  # LoRA: the state trains the adapters; the base is frozen (and the reference)
        base_params, with_reference = params, False
        params = lora_lib.init_adapters(model_config, lora, jax.random.key(seeds.derive(cfg.seed, "lora")),
                                        mesh=mesh, dtype=cfg.model.param_dtype)
        step_fn = bind_base(step_fn, base_params)
    # The reference is a copy (the state's parameters are donated to each step).
    ref_params = jax.tree.map(jnp.copy, params) if with_reference else None
    state = jax.device_put(init_train_state(params, opt), shardings)
    sampling = SamplingConfig(temperature=c.temperature, top_p=c.top_p)
    # Slots for this process's share of the groups and eval tasks (all of them on one process).
    share = -(-c.tasks_per_step // jax.process_count())
    rows = sampler_rows(c, share)  # one wave's rows (rollout.max_rows_in_flight; default the share's)
    # On several processes each samples on its own devices (tensor parallel; `rollout_mesh`).
    sampler_mesh, sampler_rules = rollout_mesh(model_config, mesh, devices=c.sampler_devices)
    if rollout_devices:  # a split pod: the samplers on their own devices, tensor parallel
        sampler_mesh = local_mesh(rollout_devices)
        sampler_rules = local_rules(model_config, sampler_mesh.shape["tensor"])
    sampler = Sampler(model_config, batch_size=rows, max_len=c.max_len, sampling=sampling,
                      stop_ids=tokenizer.eos_ids, cache_dtype=cfg.model.cache_dtype, mesh=sampler_mesh,
                      rules=sampler_rules)
    e = cfg.eval
    eval_rows = e.batch_size or (min(rows, max(1, -(-e.tasks // jax.process_count()))) if e.tasks else rows)
    eval_sampler = Sampler(model_config, batch_size=eval_rows, max_len=cfg.eval.max_len or c.max_len,
                           sampling=GREEDY, stop_ids=tokenizer.eos_ids, cache_dtype=cfg.model.cache_dtype,
                           mesh=sampler_mesh, rules=sampler_rules)
    job = Job(cfg, mesh, model_config, tokenizer, sampler, eval_sampler, step_fn, algo,
              row_multiple=r.micro_batches * data_parallel, ref_params=ref_params, lora=lora,
              base_params=base_params)
    return job, state


def bind_base(lora_step, base_params):
    """A LoRA step `(state, batch, base)` as `(state, batch)`, the form every caller uses."""
    def train_step(state, batch):
        return lora_step(state, batch, base_params)
    return train_step
