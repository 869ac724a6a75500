"""Memory plans: what a run holds per device, known before anything is allocated.

From a run config and a mesh (real, or fake CPU devices standing in for a pod slice) this
measures, per device:
  parameters, optimizer state  the shard shapes the training state is placed with;
  gradients                    parameters' shards in the master dtype (the step's temporaries);
  activations                  XLA's memory analysis of the compiled train step at the run's
                               worst-case batch (longest rows, most trained tokens), its
                               temporaries less the gradients (under the configured remat);
  sampler weights, KV cache    the rollout sampler's cache state (its shapes and shardings) and
                               its copy of the weights in the compute dtype.
Nothing is allocated: parameters are `jax.eval_shape`d and programs lowered for abstract
arguments. The training state stays resident while rollouts run, so the peak is the larger of
the train phase (state + step temporaries) and the rollout phase (state + sampler). With
`rollout.max_staleness` k > 0 the phases overlap on shared devices (their sum, plus the k + 1
published copies of the policy the collector holds: on one process in the training layout, on
several in the samplers' layout, one of them the weights it decodes with, so k more than a
synchronous run holds); with `mesh.rollout_devices` r > 0 the
training devices hold the train phase and the r rollout devices the sampler (and the copies),
each part planned on its own devices (`peak`: the larger of the two). On H hosts (`hosts`, a
pod's processes; fake devices of one process stand in for them) each samples its share of the
groups on its own devices; a split's last r / H devices of each host sample, and each publish
stages the sampler's weights on the training devices first (`staging`, counted in the train phase).
`rows_that_fit`: how many sampler rows the memory the rollout phase leaves for the KV cache
holds, contiguous (each row `rollout.max_len` slots) against paged (each row its filled
tokens in whole pages of `rollout.page_size`, at a mean fill of 1/2 and 1/8 of max_len).

The programs are the accelerator backend's (`backends.accelerator`: stacked weights, autodiff,
a plain cache), whatever machine plans them. XLA:CPU's buffer assignment stands in for the
accelerator's when the mesh is fake, so the
activation figure is an estimate of a TPU's or GPU's (fusion decisions differ); the parameter,
optimizer, gradient and cache figures are exact byte counts of the arrays.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxscaffold.backends.accelerator import Accelerator
from jaxscaffold.buckets import pow2_bucket
from jaxscaffold.config import RunConfig
from jaxscaffold.models import qwen3
from jaxscaffold.models.sharding import make_mesh
from jaxscaffold.rl.train_step import BATCH_AXES, TrainState, batch_shardings, init_train_state, state_shardings
from jaxscaffold.train.job_spec import JobSpec, split_pod

GB = 1e9


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Bytes per device of each part of a run, and the device's memory."""

    devices: int
    hbm_bytes: float
    params: int
    opt_state: int
    grads: int
    activations: int | None  # None: the train step was not compiled (`compile_step=False`)
    reference: int  # the frozen reference parameters (KL to the initial policy)
    sampler_weights: int
    kv_cache: int
    notes: tuple[str, ...] = ()
    frozen_base: int = 0  # LoRA: the frozen base weights (params, opt_state, grads: the adapters')
    rollout_devices: int = 0  # a split pod: devices that only sample (`mesh.rollout_devices`)
    published: int = 0  # rollout.max_staleness > 0: the policy copies the collector holds
    staging: int = 0  # a split pod on several hosts: the weights staged on a training device at publish
    hosts: int = 1  # processes sharing the devices, each sampling on its own
    attention_kernel: str = ""  # the training attention kernel the target's backend runs
    kv_token_bytes: float = 0.0  # per device, the keys and values of one token of one row (all layers)
    max_len: int = 0  # the sampler's context (slots a contiguous row reserves)
    page_size: int = 64  # tokens a page of a paged cache

    @property
    def state(self) -> int:
        return self.params + self.opt_state + self.reference + self.frozen_base

    @property
    def train_peak(self) -> int:
        """Of a training device (on shared devices with staleness, with the rollouts overlapping)."""
        update = self.state + self.grads + (self.activations or 0)
        if self.published and not self.rollout_devices:  # overlapped: the sampler's part at once
            return update + self.sampler_weights + self.kv_cache + self.published
        return max(update, self.state + self.staging)

    @property
    def rollout_peak(self) -> int:
        """Of a device while it samples (a split pod's rollout device holds no training state)."""
        if self.rollout_devices:
            return self.sampler_weights + self.kv_cache + self.published
        return self.state + self.sampler_weights + self.kv_cache + self.published

    @property
    def peak(self) -> int:
        return max(self.train_peak, self.rollout_peak)

    def fits(self) -> bool:
        return self.peak <= self.hbm_bytes

    def rows_that_fit(self) -> dict[str, int]:
        """Sampler rows whose keys and values fit the memory the rollout phase leaves for its
        cache: "contiguous" rows reserve `max_len` slots each; "paged_fill_1/2" and
        "paged_fill_1/8" rows hold what they fill, in whole pages, at that mean fill of max_len."""
        room = self.hbm_bytes - (self.rollout_peak - self.kv_cache)
        if room <= 0 or not self.kv_token_bytes:
            return {"contiguous": 0, "paged_fill_1/2": 0, "paged_fill_1/8": 0}

        def rows(tokens: int) -> int:
            return int(room // (tokens * self.kv_token_bytes))

        def paged(fill: float) -> int:
            return rows(-(-int(self.max_len * fill) // self.page_size) * self.page_size)

        return {"contiguous": rows(self.max_len), "paged_fill_1/2": paged(1 / 2), "paged_fill_1/8": paged(1 / 8)}

    def advice(self, cfg: RunConfig) -> list[str]:
        """What does not fit, and the knobs that shrink it (empty when the plan fits)."""
        if self.fits():
            return []
        out = []
        if self.train_peak > self.hbm_bytes:
            out.append(f"the train phase needs {self.train_peak / GB:.1f} GB of {self.hbm_bytes / GB:.1f} GB")
            if cfg.mesh.fsdp != -1 and self.params + self.opt_state > 0.3 * self.hbm_bytes:
                out.append("shard parameters and optimizer state over every device (--config.mesh.fsdp=-1 "
                           "--config.mesh.data=1) or use more devices")
            if cfg.model.param_dtype == "float32":
                out.append("bf16 master weights halve parameters, gradients and moments "
                           "(--config.model.param_dtype=bfloat16)")
            room = self.hbm_bytes - self.state - self.grads
            if self.activations and self.activations > 0.25 * self.hbm_bytes:
                if cfg.model.remat_policy != "full":
                    out.append("recompute activations (--config.model.remat_policy=full)")
                if room > 0:  # activations scale about with the rows of one micro-batch
                    need = cfg.rl.micro_batches * 2 ** math.ceil(math.log2(max(1.0, self.activations / room)))
                    out.append(f"about --config.rl.micro_batches={need} (activations scale with the rows of a "
                               "micro-batch; launch/plan.py --search checks it), or shorter rows (rollout.max_len)")
                else:
                    out.append("parameters, moments and gradients alone exceed the device: more devices or fsdp")
            if cfg.rl.kl_coef:
                out.append("the KL reference holds a copy of the parameters (rl.kl_coef=0 drops it)")
        if self.rollout_peak > self.hbm_bytes:
            out.append(f"the rollout phase needs {self.rollout_peak / GB:.1f} GB "
                       f"(KV cache {self.kv_cache / GB:.1f} GB) of {self.hbm_bytes / GB:.1f} GB")
            knobs = "fewer rows (rollout.tasks_per_step x group_size) or a shorter rollout.max_len"
            if cfg.model.cache_dtype == "float32":
                knobs += ", or --config.model.cache_dtype=bfloat16"
            out.append(f"a smaller cache: {knobs}")
        return out

    def table(self) -> str:
        rows = [("parameters", self.params), ("optimizer state", self.opt_state), ("gradients", self.grads),
                ("activations (train step temporaries)", self.activations),
                ("KL reference parameters", self.reference), ("LoRA frozen base", self.frozen_base),
                ("sampler weights", self.sampler_weights),
                ("KV cache", self.kv_cache), ("published policy copies (staleness)", self.published),
                ("publish staging (split pod, hosts)", self.staging),
                ("peak, train phase" + (" (training devices)" if self.rollout_devices else ""), self.train_peak),
                ("peak, rollout phase" + (f" ({self.rollout_devices} rollout devices)" if self.rollout_devices else ""),
                 self.rollout_peak)]
        lines = [f"{name:<40} {'not compiled' if b is None else f'{b / GB:9.2f} GB'}" for name, b in rows]
        verdict = "fits" if self.fits() else "does NOT fit"
        lines.append(f"{'device memory':<40} {self.hbm_bytes / GB:9.2f} GB: {verdict}")
        if self.kv_token_bytes:
            fit = self.rows_that_fit()
            lines.append(f"{'rows_that_fit (the KV memory left)':<40} contiguous {fit['contiguous']}, paged "
                         f"{fit['paged_fill_1/2']} at a mean fill of 1/2, {fit['paged_fill_1/8']} at 1/8 "
                         f"(max_len {self.max_len}, pages of {self.page_size})")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(train_peak=self.train_peak, rollout_peak=self.rollout_peak, peak=self.peak, fits=self.fits(),
                 rows_that_fit=self.rows_that_fit())
        return d


def _shard_bytes(shapes, shardings) -> int:
    """Bytes of the largest shard per device (the shards of one array differ at most by padding)."""
    total = 0
    for s, sh in zip(jax.tree.leaves(shapes), jax.tree.leaves(shardings)):
        shard = sh.shard_shape(s.shape) if sh is not None else s.shape
        total += math.prod(shard) * np.dtype(s.dtype).itemsize
    return total


def _abstract(shapes, shardings):
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


def worst_case_batch(cfg: RunConfig) -> tuple[int, int, int]:
    """(rows, row length, trained positions) of the largest optimizer step a run can take:
    every row as long as the context, every model turn at its token budget."""
    c = cfg.rollout
    rows = c.tasks_per_step * c.group_size
    if c.representation == "stepwise":
        rows *= c.max_turns  # a row per model turn
    rows = -(-rows // cfg.rl.num_minibatches)
    length = pow2_bucket(c.max_len, 64)
    turns = 1 if c.representation == "stepwise" else c.max_turns
    positions = min(length, pow2_bucket(c.max_new_tokens * turns, 16, per_octave=2))
    return rows, length, positions


def plan(cfg: RunConfig, *, hbm_bytes: float, devices: list | None = None, compile_step: bool = True,
         platform: str = "portable", hosts: int | None = None) -> MemoryPlan:
    """The memory plan of `cfg` on `devices` (default: all), e.g. fake CPU devices of a pod's count,
    for a `platform` ("tpu", "gpu" or "portable"), whose backend chooses the attention kernel.
    `hosts` (default JAX's process count): the processes the devices belong to, in equal
    consecutive blocks, each sampling its share of the groups on its own devices (a split pod's
    rollout devices are the last of each; on fake devices of one process the first host's stand
    for every host's). Everything but the batch's shape comes from `JobSpec.from_config(cfg)`,
    as `build_job`'s does."""
    devices = list(jax.devices() if devices is None else devices)
    hosts = jax.process_count() if hosts is None else hosts
    if hosts < 1 or len(devices) % hosts:
        raise ValueError(f"{len(devices)} devices do not split evenly over {hosts} hosts")
    spec = JobSpec.from_config(cfg, processes=hosts)
    split = spec.rollout_devices
    host_of = [i * hosts // len(devices) for i in range(len(devices))]
    train_part, rollout_part = split_pod(devices, host_of, split) if split else (devices, None)
    mesh = make_mesh(spec.mesh, train_part)
    config = spec.model
    optimizer = spec.optimizer.make()
    param_shapes = qwen3.param_shapes(config)
    # LoRA: the state trains the adapters; the base (also the KL reference) is a frozen argument.
    lora = spec.lora
    trained = spec.trained_shapes()
    state_sh = state_shardings(config, optimizer, mesh, lora=lora)
    state_shapes = jax.eval_shape(lambda p: init_train_state(p, optimizer), trained)
    params = _shard_bytes(state_shapes.params, state_sh.params)
    opt_state = _shard_bytes(state_shapes.opt_state, state_sh.opt_state)
    with_reference = spec.with_reference
    reference = params if spec.reference_copy else 0
    base_sh = qwen3.param_shardings(config, mesh)
    frozen_base = 0 if lora is None else _shard_bytes(param_shapes, base_sh)
    notes = []

    # The target's attention kernel. Splash / cuDNN do not compile on CPU devices: the step
    # compiled here runs the flash loop in their place, O(T) in memory like them.
    kernel = config.attention_impl
    if kernel == "auto":
        kernel = Accelerator(platform).attention_impl(config.compute_dtype, len(devices))
    step_config = config.replace(attention_impl="flash") if kernel in ("splash", "cudnn") else config
    compiled = Accelerator().with_kernels(step_config).attention_impl
    if kernel != compiled:
        notes.append(f"attention: the target runs the {kernel} kernel (on a mesh, per device under shard_map); "
                     f"the step compiled here runs the {compiled} loop in its place, O(T) in memory like it")

    activations = None
    if compile_step:
        step = dataclasses.replace(spec, model=step_config).train_step(mesh=mesh, backend=Accelerator())
        rows, length, positions = worst_case_batch(cfg)
        rows += (-rows) % spec.row_multiple(mesh)
        dtypes = {"tokens_BT": jnp.int32, "segment_ids_BT": jnp.int32, "loss_mask_BT": jnp.int32,
                  "old_logp_BT": jnp.float32, "adv_B": jnp.float32}
        b_sh = batch_shardings(mesh)
        batch = {k: jax.ShapeDtypeStruct((rows, length)[: len(BATCH_AXES[k])], dtypes[k], sharding=b_sh[k])
                 for k in BATCH_AXES}
        state = _abstract(state_shapes, state_sh)
        ref = (_abstract(state_shapes.params, state_sh.params),) if with_reference else ()
        if lora is not None:  # the step's frozen argument is the base
            ref = (_abstract(param_shapes, base_sh),)
        stats = step.lower(state, batch, *ref, num_positions=positions).compile().memory_analysis()
        grads = params
        activations = max(0, int(stats.temp_size_in_bytes) - grads)
        notes.append(f"train step compiled for {rows} rows x {length} tokens, {positions} trained positions a row")
        if compiled == "xla":
            # The portable fallback holds f32 scores of a query block (at most 8 blocks) over its keys.
            rows_dev = -(-rows // spec.row_multiple(mesh))
            scores = rows_dev * config.num_heads * -(-length // 8) * length * 4
            notes.append(f"attention compiled as the XLA fallback, whose f32 score blocks take ~{scores / GB:.1f} GB "
                         "a layer here")
    grads = params

    # The sampler: rows of this process's share of the groups, its cache as it is built.
    # A split pod samples on its rollout devices (`job.split_devices`); else each process on its own.
    sampler_part = rollout_part  # a split's rollout devices (None: this process's own, `rollout_mesh`)
    if hosts > 1 and jax.process_count() == 1:  # a pod planned on fake devices: the first host's stand for every host's
        part = rollout_part or devices
        sampler_part = part[:len(part) // hosts]
    local, local_rules = spec.rollout_mesh(mesh, sampler_part)
    sampler = spec.sampler.build(config, mesh=local, rules=local_rules, layout="stacked")
    cache = jax.eval_shape(sampler.init_state)
    cache_sh = sampler.programs.state_shardings()
    kv_token = _kv_token_bytes(config, sampler, local, local_rules)
    kv = _shard_bytes(cache, cache_sh) if cache_sh is not None else sum(
        math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(cache))
    # Rollouts sample with the training state's parameters resharded onto each process's own
    # devices (`multihost.rollout_mesh`: tensor parallel over them); a one-device process
    # samples with them as they are placed (the stacked layout casts inside its programs).
    sampler_weights = 0
    if local is not None:
        sampler_weights = _shard_bytes(param_shapes, qwen3.param_shardings(config, local, local_rules))
        notes.append(f"rollouts run on each process's {local.size} devices, the parameters resharded over them")
    if cache_sh is None:
        notes.append("the sampler is not sharded: its cache and weights sit on one device of each process")
    sampler_copy = sampler_weights  # one version in the samplers' layout
    if lora is not None:  # the merge the samplers decode with: its targets are new arrays
        dtype = jnp.promote_types(config.param_dtype, config.compute_dtype)
        sampler_weights += sum(_shard_bytes(jax.ShapeDtypeStruct(param_shapes["layers"][t].shape, dtype),
                                            base_sh["layers"][t]) for t in lora.targets)
        notes.append(f"LoRA rank {lora.rank}: the samplers decode with the base merged with the adapters "
                     "(a copy of the adapted matrices, made once per update)")
    # The collector's copies of the policy: while it samples with version t - 1 - k the trainer
    # publishes up to version t - 1, so k + 1 at most; on a split pod they are the sampler's
    # weights (one counted above); on several processes each host's in the samplers' layout
    # (`collector.AheadCollector`: its thread converts nothing), one of them the weights the
    # sampler decodes with (counted above); else full copies on the training devices.
    policy = _shard_bytes(param_shapes, base_sh)
    c = cfg.rollout
    if rollout_part:
        published = c.max_staleness * sampler_weights
    elif hosts > 1:
        published = c.max_staleness * sampler_copy
    else:
        published = (c.max_staleness + 1) * policy
    published = published if c.max_staleness else 0
    # Several hosts, split: the publish stages the weights on the training devices in the
    # sampler's layout (`local_mesh.to_local`), next to the state, after the step's temporaries are freed.
    staging = sampler_weights if split and hosts > 1 else 0
    if hosts > 1:
        notes.append(f"{hosts} hosts of {len(devices) // hosts} devices: each samples "
                     f"{spec.sampler.batch_size} rows (its share of the groups) on its own devices"
                     + (f"; the collector holds up to {c.max_staleness + 1} versions in the samplers' layout"
                        if c.max_staleness and not rollout_part else ""))
    if split:
        notes.append(f"a split pod: {len(devices) - split} devices train, {split} sample"
                     + (f" (the last {split // hosts} of each of the {hosts} hosts; publishing stages the "
                        "sampler's weights on the training devices)" if hosts > 1 else ""))
    if c.max_staleness:
        notes.append(f"rollout.max_staleness={c.max_staleness}: up to {c.max_staleness + 1} policy copies held for the collector"
                     + ("" if split else "; rollouts overlap the update on the same devices"))
    return MemoryPlan(len(devices), hbm_bytes, params, opt_state, grads, activations, reference, sampler_weights,
                      kv, tuple(notes), frozen_base=frozen_base, rollout_devices=split, published=published, staging=staging,
                      attention_kernel=kernel, kv_token_bytes=kv_token, max_len=sampler.max_len,
                      page_size=cfg.rollout.page_size, hosts=hosts)


def _kv_token_bytes(config, sampler, mesh, rules) -> float:
    """Per device, the keys and values of one token of one row: a contiguous cache's bytes per
    device over its rows and slots (rows sharded over devices each count their share)."""
    rows, slots = sampler.batch_size, sampler.max_len
    shape = jax.ShapeDtypeStruct((config.num_layers, rows, config.num_kv_heads, slots, config.head_dim),
                                 jnp.dtype(sampler.cache_dtype))
    shard = shape.shape if mesh is None else Accelerator().kv_sharding(config, mesh, rules).shard_shape(shape.shape)
    return 2 * math.prod(shard) * shape.dtype.itemsize / (rows * slots)
