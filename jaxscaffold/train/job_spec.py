"""What a run trains, described once from its config: `JobSpec.from_config(cfg)`.

The spec is pure: no device is allocated and no weight loaded (at most a checkpoint's
config.json is read). `train.job.build_job` materializes it (mesh, parameters, samplers, the
compiled step); `train.memory_plan.plan` lowers the same step and sampler for abstract
arguments; `launch/benchmarks/train_flops.py` counts the same step. None of them derives the
optimizer, the algorithm, the reference, LoRA or the samplers' settings itself.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax

from jaxscaffold import config as config_lib
from jaxscaffold.config import RunConfig
from jaxscaffold.models import config as model_config_lib
from jaxscaffold.models import hf_io, hub, qwen3
from jaxscaffold.models import lora as lora_lib
from jaxscaffold.models.local_mesh import local_mesh, local_rules
from jaxscaffold.models.sharding import MeshConfig
from jaxscaffold.models.word_tokenizer import padded_vocab_size
from jaxscaffold.rl.losses import Correction
from jaxscaffold.rl.presets import AlgorithmConfig, preset
from jaxscaffold.rl.train_step import OptimizerConfig, make_train_step
from jaxscaffold.rollout.engine import Sampler, SamplerOptions
from jaxscaffold.rollout.sampling import GREEDY, SamplingConfig
from jaxscaffold.train.multihost import rollout_mesh
from jaxscaffold.train.vocabularies import word_tokenizer
from jaxscaffold.train.waves import sampler_rows


def split_pod(devices: list, hosts: list[int], rollout_devices: int) -> tuple[list, list]:
    """A split pod's (training devices, rollout devices) of `devices` (`mesh.rollout_devices`),
    `hosts[i]` the host (process) of `devices[i]`: on each of the P hosts its last r / P
    devices sample, and the others of every host form one training mesh, each list in the
    order of `devices`. Each host's rollouts stay on its own devices (docs/async_training.md).
    On several hosts the weights pass through a staging layout of r / P training devices
    (`local_mesh.to_local`), so a host's training devices must come in groups of that many."""
    r, count = rollout_devices, len(set(hosts))
    per_host = len(devices) // count
    k = r // count
    if r % count or not 0 < k < per_host or (count > 1 and (per_host - k) % k):
        raise ValueError(f"config.mesh.rollout_devices={r}: a split needs 1 <= n < {len(devices)} (the run's devices), "
                         f"on {count} processes of {per_host} devices the same n / {count} of each, with the rest "
                         "of each process's devices a multiple of it")
    rollout = set()
    for h in sorted(set(hosts)):
        rollout.update([d for d, host in zip(devices, hosts) if host == h][-k:])
    return [d for d in devices if d not in rollout], [d for d in devices if d in rollout]


def lora_config(lo: config_lib.Lora | None) -> lora_lib.LoraConfig | None:
    """The adapters of a run's `lora` section (None: full fine-tuning; configs written before
    LoRA have no section)."""
    if lo is None or lo.rank == 0:
        return None
    return lora_lib.LoraConfig(rank=lo.rank, alpha=lo.alpha, targets=lo.target_names())


def base_dtype(cfg: RunConfig) -> str:
    """The dtype the model's parameters are stored in: the master weights' (model.param_dtype),
    or with LoRA the frozen base's (lora.base_dtype)."""
    return cfg.lora.base_dtype if lora_config(cfg.lora) is not None else cfg.model.param_dtype


def model_config(cfg: RunConfig) -> model_config_lib.Qwen3Config:
    """The run's architecture and execution options without loading a weight: the checkpoint's
    config.json (`model.hf_path`), else the preset. With LoRA the parameters are the frozen
    base, in `lora.base_dtype`."""
    m = cfg.model
    execution = {"param_dtype": base_dtype(cfg), "compute_dtype": m.compute_dtype, "scan_layers": m.scan_layers,
                 "remat_policy": m.remat_policy}
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


def optimizer_config(cfg: RunConfig) -> OptimizerConfig:
    """The run's optimizer (its `learning_rate()` schedule is what the logs report)."""
    r = cfg.rl
    cosine = r.lr_schedule == "cosine"  # (a constant schedule's spec does not depend on the run's length)
    return OptimizerConfig(lr=r.lr, weight_decay=r.weight_decay, grad_clip=r.grad_clip, warmup_steps=r.warmup_steps,
                           schedule=r.lr_schedule, decay_steps=cfg.steps if cosine else 0)


def correction(cfg: RunConfig) -> Correction:
    """The run's off-policy correction of sampled tokens (TIS, MIS: `rl.losses.Correction`)."""
    r = cfg.rl
    return Correction(tis_cap=r.tis_cap, mis=r.mis, mis_lo=r.mis_lo, mis_hi=r.mis_hi,
                      mis_denominator=r.mis_denominator)


def algorithm_config(cfg: RunConfig) -> AlgorithmConfig:
    """The run's algorithm: its preset with the config's coefficients, its off-policy correction
    and its loss's token normaliser (`agg_constant`: a step's longest possible trained tokens).
    The run, not the preset, sets DAPO's overlong shaping (rl.overlong_buffer, 0: off)."""
    r, c = cfg.rl, cfg.rollout
    return preset(r.algorithm, kl_coef=r.kl_coef, entropy_coef=r.entropy_coef, overlong_buffer=r.overlong_buffer or None,
                  agg_constant=float(c.max_new_tokens * c.max_turns), correction=correction(cfg))


@dataclasses.dataclass(frozen=True)
class SamplerSpec:
    """One sampler's settings: its slots (rows decoded at once), context, and how it draws
    tokens and stores its KV cache (`SamplerOptions`)."""

    batch_size: int
    max_len: int
    options: SamplerOptions

    def build(self, model_config, *, mesh, rules, stop_ids=(), **overrides) -> Sampler:
        """The `Sampler` of these settings on `mesh` (`JobSpec.rollout_mesh`); `overrides`
        replace fields of its options (the memory plan lowers the stacked layout's)."""
        return Sampler(model_config, batch_size=self.batch_size, max_len=self.max_len, stop_ids=stop_ids,
                       options=dataclasses.replace(self.options, **overrides), mesh=mesh, rules=rules)


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """The model side of a run as values: what `build_job`, `memory_plan.plan` and the FLOP
    count all build from."""

    mesh: MeshConfig  # axis sizes (-1: fill); the devices are chosen when the mesh is made
    mesh_devices: int  # config.mesh.devices: the first n devices (0: all)
    model: model_config_lib.Qwen3Config
    optimizer: OptimizerConfig
    algo: AlgorithmConfig  # with the run's overrides: its correction and agg_constant too
    lora: lora_lib.LoraConfig | None  # None: full fine-tuning
    adapter_dtype: str  # LoRA: the adapters' (trained) dtype; the base is in `model.param_dtype`
    micro_batches: int
    sampler_devices: int  # a process's sampler mesh: its first n devices (0: all; `multihost.rollout_mesh`)
    rollout_devices: int  # a split pod: the last n devices only sample (0: the training devices sample)
    sampler: SamplerSpec  # training rollouts
    eval_sampler: SamplerSpec  # greedy evaluation
    seed: int

    @classmethod
    def from_config(cls, cfg, *, processes: int | None = None) -> JobSpec:
        """The spec of `cfg` (a RunConfig or its ml_collections form). `processes`: how many
        processes share the rollouts (default JAX's count); each samples its share of groups."""
        cfg = config_lib.typed(cfg)
        processes = jax.process_count() if processes is None else processes
        c, e = cfg.rollout, cfg.eval
        share = -(-c.tasks_per_step // processes)  # this process's groups per step
        rows = sampler_rows(c, share)  # one wave's rows (rollout.max_rows_in_flight; default the share's)
        eval_rows = e.batch_size or (min(rows, max(1, -(-e.tasks // processes))) if e.tasks else rows)
        cache = dict(cache_dtype=cfg.model.cache_dtype, kv_cache=c.kv_cache, page_size=c.page_size, kv_pages=c.kv_pages)
        sampling = SamplingConfig(temperature=c.temperature, top_p=c.top_p)
        return cls(
            mesh=MeshConfig(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor), mesh_devices=cfg.mesh.devices,
            model=model_config(cfg), optimizer=optimizer_config(cfg), algo=algorithm_config(cfg),
            lora=lora_config(cfg.lora), adapter_dtype=cfg.model.param_dtype, micro_batches=cfg.rl.micro_batches,
            sampler_devices=c.sampler_devices, rollout_devices=cfg.mesh.rollout_devices,
            sampler=SamplerSpec(rows, c.max_len, SamplerOptions(sampling=sampling, **cache)),
            eval_sampler=SamplerSpec(eval_rows, e.max_len or c.max_len, SamplerOptions(sampling=GREEDY, **cache)),
            seed=cfg.seed)

    @property
    def correction(self) -> Correction:
        """The off-policy correction of sampled tokens (TIS, MIS), the algorithm's."""
        return self.algo.correction

    @property
    def agg_constant(self) -> float:
        """The loss's token normaliser: a step's longest possible trained tokens."""
        return self.algo.agg_constant

    @property
    def with_reference(self) -> bool:
        """Whether the step takes a frozen reference argument (KL to the initial policy; with
        LoRA the frozen base, which is also the reference)."""
        return bool(self.algo.kl_coef)

    @property
    def reference_copy(self) -> bool:
        """Whether the run holds a copy of the initial parameters as the KL reference (not with
        LoRA: there the base is the reference)."""
        return self.with_reference and self.lora is None

    def trained_shapes(self) -> dict:
        """`jax.ShapeDtypeStruct`s of what the optimizer trains: the parameters, or the adapters."""
        if self.lora is None:
            return qwen3.param_shapes(self.model)
        return lora_lib.adapter_shapes(self.model, self.lora, self.adapter_dtype)

    def train_step(self, *, mesh=None, backend=None):
        """The jitted train step of this spec (`rl.train_step.make_train_step`):
        `(state, batch, frozen=None)`, `frozen` the reference (or LoRA's base) where
        `with_reference` or LoRA."""
        # The config (not an optax object) names the optimizer: equal specs share the compiled step.
        return make_train_step(self.model, self.algo, self.optimizer, num_micro_batches=self.micro_batches,
                               mesh=mesh, backend=backend, lora=self.lora)

    def rollout_mesh(self, train_mesh, rollout_devices: list | None = None) -> tuple:
        """(mesh, rules) the samplers run on: this process's devices of the training mesh
        (`multihost.rollout_mesh`), or this process's of a split pod's `rollout_devices`,
        tensor parallel (`sampler_devices` > 0: the first that many)."""
        if rollout_devices:
            mesh = local_mesh(rollout_devices)
            if self.sampler_devices:
                mesh = local_mesh(list(mesh.devices.flat)[:self.sampler_devices])
            return mesh, local_rules(self.model, mesh.shape["tensor"])
        return rollout_mesh(self.model, train_mesh, devices=self.sampler_devices)

    def row_multiple(self, mesh) -> int:
        """What a batch's rows are padded to: every micro-batch split over the data-parallel axes."""
        return self.micro_batches * mesh.shape["data"] * mesh.shape["fsdp"]
