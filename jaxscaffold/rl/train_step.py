"""One jitted optimizer step of the policy loss, sharded, with exact gradient accumulation.

A batch is a dict of arrays (all rows of one optimizer step):
  tokens_BT      int32   the token sequence (prompt, model and environment tokens)
  segment_ids_BT int32   0 = padding (see `qwen3.hidden_states`)
  loss_mask_BT   int32   1 on the tokens trained on (model tokens), aligned with tokens
  old_logp_BT    f32     log-probs of those tokens under the rollout policy
  adv_B          f32     advantage of each row (spread uniformly over its tokens)
and optionally
  tis_weight_BT  f32     truncated importance-sampling weights (`make_old_logprob_step` adds them)
  sampler_logp_BT f32    the sampler's log-probs beside recomputed old ones (MIS, `rl.mis`)

The batch is split into `num_micro_batches` micro-batches whose gradients are summed inside
the jitted step. Every loss term is divided by the *full batch's* token / sequence counts
(`losses.loss_denominators`), so any number of micro-batches gives the same update as one
big batch, in every aggregation mode. A step whose loss or gradient is not finite is
skipped (parameters and optimizer state unchanged) and counted.

`make_old_logprob_step` is the forward pass that replaces the sampler's `old_logp_BT` by the
trainer's before a rollout batch's first update (verl's "old log-probs recomputed by the
actor"), measuring their mismatch (`rl.mismatch`) on the way.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from jaxscaffold import backends
from jaxscaffold.buckets import pow2_bucket
from jaxscaffold.models import lora as lora_lib
from jaxscaffold.models.config import Qwen3Config
from jaxscaffold.models.qwen3 import param_shapes, param_shardings
from jaxscaffold.models.sharded_attention import kernel_mesh
from jaxscaffold.models.sharding import DEFAULT_RULES, ShardingRules
from jaxscaffold.rl.logprobs import masked_token_logprobs, token_logprobs
from jaxscaffold.rl import mismatch
from jaxscaffold.rl.losses import NO_CORRECTION, Correction, loss_denominators, mis_batch_keep, policy_loss
from jaxscaffold.rl.presets import AlgorithmConfig

BATCH_AXES = {
    "tokens_BT": ("batch", "seq"), "segment_ids_BT": ("batch", "seq"), "loss_mask_BT": ("batch", "seq"),
    "old_logp_BT": ("batch", "seq"), "adv_B": ("batch",),
}
# Entries a batch may add: TIS weights, and the sampler's log-probs where MIS needs them next to
# the recomputed old ones (`make_old_logprob_step`).
OPTIONAL_BATCH_AXES = {"tis_weight_BT": ("batch", "seq"), "sampler_logp_BT": ("batch", "seq")}


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with global-norm clipping and a warmup-then-constant (or cosine) schedule."""

    lr: float = 1e-6
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    warmup_steps: int = 0
    schedule: str = "constant"  # constant | cosine (decays to 0 at decay_steps)
    decay_steps: int = 0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8

    def learning_rate(self) -> optax.Schedule:
        if self.schedule == "constant":
            after = optax.constant_schedule(self.lr)
        elif self.schedule == "cosine":
            after = optax.cosine_decay_schedule(self.lr, max(1, self.decay_steps - self.warmup_steps))
        else:
            raise ValueError(f"unknown schedule {self.schedule!r} (constant, cosine)")
        if self.warmup_steps <= 0:
            return after
        warmup = optax.linear_schedule(0.0, self.lr, self.warmup_steps)
        return optax.join_schedules([warmup, after], [self.warmup_steps])

    def make(self) -> optax.GradientTransformation:
        return optax.chain(
            optax.clip_by_global_norm(self.grad_clip),
            optax.adamw(self.learning_rate(), b1=self.b1, b2=self.b2, eps=self.eps,
                        weight_decay=self.weight_decay),
        )


@flax.struct.dataclass  # a pytree (frozen): jitted steps take and return it
class TrainState:
    step: jax.Array  # int32: optimizer steps taken (skipped ones excluded)
    params: Any
    opt_state: Any
    skipped: jax.Array  # int32: steps skipped for a non-finite loss or gradient


def init_train_state(params, optimizer: optax.GradientTransformation) -> TrainState:
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params),
                      skipped=jnp.zeros((), jnp.int32))


def state_shardings(config: Qwen3Config, optimizer, mesh, rules: ShardingRules = DEFAULT_RULES,
                    lora: lora_lib.LoraConfig | None = None) -> TrainState:
    """Shardings of a TrainState: optimizer moments shard like their parameters (with `lora`,
    the trained parameters are the adapters)."""
    p_sh = param_shardings(config, mesh, rules) if lora is None else lora_lib.adapter_shardings(config, lora, mesh, rules)
    replicated = NamedSharding(mesh, PartitionSpec())
    shapes = jax.eval_shape(optimizer.init, param_shapes(config) if lora is None else lora_lib.adapter_shapes(config, lora))
    opt_sh = optax.tree_map_params(optimizer, lambda _, s: s, shapes, p_sh,
                                   transform_non_params=lambda _: replicated)
    return TrainState(step=replicated, params=p_sh, opt_state=opt_sh, skipped=replicated)


def batch_shardings(mesh, rules: ShardingRules = DEFAULT_RULES, keys=None) -> dict:
    """Shardings of a batch's entries (`keys`, default `BATCH_AXES`'; optional ones too)."""
    axes = {**BATCH_AXES, **OPTIONAL_BATCH_AXES}
    return {k: rules.sharding(mesh, axes[k]) for k in (BATCH_AXES if keys is None else keys)}


def _batch_keys(batch) -> tuple:
    """The entries of `batch` a step reads, in a fixed order (a part of its program's key)."""
    return tuple(BATCH_AXES) + tuple(k for k in OPTIONAL_BATCH_AXES if k in batch)


def _micro_batches(batch: dict, n: int) -> dict:
    """[B, ...] -> [n, B/n, ...], micro-batch m taking rows m, m+n, m+2n, ...: with the batch
    sharded in contiguous blocks, every device holds rows of every micro-batch."""
    def split(x):
        if x.shape[0] % n:
            raise ValueError(f"batch of {x.shape[0]} rows is not divisible into {n} micro-batches")
        return x.reshape((x.shape[0] // n, n) + x.shape[1:]).swapaxes(0, 1)
    return jax.tree.map(split, batch)


Optimizer = optax.GradientTransformation | OptimizerConfig


def make_train_step(model_config: Qwen3Config, algo: AlgorithmConfig, optimizer: Optimizer,
                    *, num_micro_batches: int = 1, logprob_chunk: int | None = None, mesh=None,
                    rules: ShardingRules = DEFAULT_RULES, score_masked_only: bool = True, backend=None,
                    lora: lora_lib.LoraConfig | None = None) -> Callable:
    """Builds `train_step(state, batch, frozen=None) -> (state, metrics)`, jitted.

    `algo` is the whole loss: the algorithm's settings with the run's (`agg_constant`, the
    off-policy `correction`, the KL and entropy weights).
    `optimizer`: an optax transformation, or an `OptimizerConfig` (the same transformation as
    its `make()`; equal configs share compiled steps, so a run that builds its step anew, a
    resumed job or the next test, compiles nothing again).
    `logprob_chunk` is the sequence positions per logprob chunk (default: about 1024 tokens
    of the micro-batch, i.e. ~600 MB of f32 logits at Qwen3's vocabulary).
    With a mesh, the step has explicit in/out shardings (parameters and optimizer state as
    the rules say, rows over the batch axes) and donates the state.
    `frozen`: the parameters the step reads but does not train, where it has any: the KL
    reference (`algo.kl_coef` > 0: the initial parameters) or, with `lora`, the base.
    `score_masked_only` unembeds only the trained-on positions (their largest count in a row,
    bucketed to 16 * 2**k or 1.5 times that, is a static shape: one compiled program per
    bucket); off, every position.
    `backend` (default: the platform's, `backends.current()`) supplies the model's kernels
    (e.g. the CPU's dense-layer VJP); a memory plan or a FLOP count for an accelerator passes
    `backends.accelerator.Accelerator()` on any machine.
    `lora` (a `models.lora.LoraConfig`): the state's parameters are the adapters (the only ones
    in the optimizer), `frozen` the base they are merged into (`lora.merge`); the KL reference
    is the base itself (the adapters at zero).
    """
    return _train_step(_Step(model_config, PolicyObjective(algo, logprob_chunk), optimizer, num_micro_batches, mesh,
                             rules, bool(algo.kl_coef), backend or backends.current(), lora),
                       score_masked_only)


def make_sft_step(model_config: Qwen3Config, optimizer: Optimizer, *,
                  num_micro_batches: int = 1, logprob_chunk: int | None = None, mesh=None,
                  rules: ShardingRules = DEFAULT_RULES, score_masked_only: bool = True, backend=None,
                  lora: lora_lib.LoraConfig | None = None) -> Callable:
    """`sft_step(state, batch, frozen=None) -> (state, metrics)`: token-level cross-entropy on
    the masked tokens (mean over all of the batch's masked tokens), the same state, batch
    layout, sharding, accumulation and non-finite guard as `make_train_step` (with `lora`,
    `frozen` is the base); adv / old_logp unused."""
    return _train_step(_Step(model_config, SFTObjective(logprob_chunk), optimizer, num_micro_batches, mesh,
                             rules, with_reference=False, backend=backend or backends.current(), lora=lora),
                       score_masked_only)


def _logprobs(params, config, mb, num_positions, logprob_chunk):
    """(logp_BT, entropy_BT) of a micro-batch: all positions (num_positions None) or only the
    first `num_positions` masked ones of each row (what the loss reads)."""
    # Positions per logprob chunk: about 1024 tokens of [tokens, vocab] f32 logits at once.
    chunk = logprob_chunk or max(1, 1024 // mb["tokens_BT"].shape[0])
    if num_positions is None:
        return token_logprobs(params, config, mb["tokens_BT"], segment_ids_BT=mb["segment_ids_BT"], chunk=chunk)
    return masked_token_logprobs(params, config, mb["tokens_BT"], mb["loss_mask_BT"], num_positions,
                                 segment_ids_BT=mb["segment_ids_BT"], chunk=chunk)


@dataclasses.dataclass(frozen=True)
class PolicyObjective:
    """The RL policy loss of an algorithm (`rl.losses.policy_loss`) on a micro-batch."""

    algo: AlgorithmConfig  # with the run's agg_constant and correction (TIS weights come in the batch)
    logprob_chunk: int | None = None

    def __call__(self, config, params, mb, denominators, ref_params, num_positions):
        logp, entropy = _logprobs(params, config, mb, num_positions, self.logprob_chunk)
        ref_logp = None
        if ref_params is not None:
            ref_logp = jax.lax.stop_gradient(_logprobs(ref_params, config, mb, num_positions, self.logprob_chunk)[0])
        loss, metrics = policy_loss(logp, mb["old_logp_BT"], mb["adv_B"], mb["loss_mask_BT"], self.algo,
                                    ref_logp_BT=ref_logp, entropy_BT=entropy, denominators=denominators,
                                    tis_weight_BT=mb.get("tis_weight_BT"), sampler_logp_BT=mb.get("sampler_logp_BT"))
        # The current policy against the batch's old log-probs: at a rollout batch's first
        # optimizer step (no update yet) and with the sampler's log-probs, the mismatch.
        metrics.update(mismatch.mismatch_metrics(logp, mb["old_logp_BT"], mb["loss_mask_BT"],
                                                 num_tokens=denominators["tokens"]))
        return loss, metrics


@dataclasses.dataclass(frozen=True)
class SFTObjective:
    """Token-level cross-entropy on the masked tokens, over all of the batch's masked tokens."""

    logprob_chunk: int | None = None

    def __call__(self, config, params, mb, denominators, ref_params, num_positions):
        del ref_params
        logp, entropy = _logprobs(params, config, mb, num_positions, self.logprob_chunk)
        mask = mb["loss_mask_BT"].astype(jnp.float32)
        n = jnp.maximum(denominators["tokens"], 1.0)
        nll = -jnp.sum(jnp.where(mask > 0, logp, 0.0)) / n
        return nll, {"loss": nll, "nll": nll, "entropy": jnp.sum(jnp.where(mask > 0, entropy, 0.0)) / n}


@dataclasses.dataclass(frozen=True)
class _Step:
    """Everything a compiled step depends on besides its arguments' shapes. Hashable (an optax
    transformation by identity, an OptimizerConfig by value), so equal steps share programs."""

    model_config: Qwen3Config
    objective: PolicyObjective | SFTObjective
    optimizer: Optimizer
    num_micro_batches: int
    mesh: Any
    rules: ShardingRules
    with_reference: bool  # the loss's KL term reads frozen reference parameters
    backend: Any  # a frozen dataclass of `jaxscaffold.backends` (hashable): the model's kernels
    lora: lora_lib.LoraConfig | None = None  # trained parameters are adapters over a frozen base

    @property
    def transformation(self) -> optax.GradientTransformation:
        opt = self.optimizer
        return opt.make() if isinstance(opt, OptimizerConfig) else opt


def _update(step: _Step, num_positions, state: TrainState, batch: dict, ref_params=None, base=None):
    """The optimizer step around the micro-batch loss: exact accumulation over micro-batches
    (every loss term divides by the full batch's counts) and a skipped non-finite step."""
    batch = {k: batch[k] for k in _batch_keys(batch)}
    correction = step.objective.algo.correction if isinstance(step.objective, PolicyObjective) else NO_CORRECTION
    denominators = loss_denominators(batch["loss_mask_BT"], mis_batch_keep(
        batch["loss_mask_BT"], batch.get("old_logp_BT"), batch.get("sampler_logp_BT"), correction))
    loss_fn = functools.partial(step.objective, step.backend.with_kernels(step.model_config))
    if step.lora is not None:  # LoRA: differentiate through the merge, w.r.t. the adapters only
        loss_fn = _lora_loss(loss_fn, step, base)
        ref_params = base if step.with_reference else None
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def grads_and_metrics(mb):
        (_, m), g = grad_fn(state.params, mb, denominators, ref_params, num_positions)
        return g, m

    if step.num_micro_batches == 1:
        grads, metrics = grads_and_metrics(batch)
    else:
        # One scan over the micro-batches from an empty sum (so the program holds one copy of
        # the forward and backward pass): 0 + g equals g exactly, and min / max metrics start
        # from +-inf, so the sums are those of one big batch's terms.
        micro = _micro_batches(batch, step.num_micro_batches)
        shapes = jax.eval_shape(grads_and_metrics, jax.tree.map(lambda x: x[0], micro))
        empty = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        empty[1].update({k: jnp.full(shapes[1][k].shape, _EMPTY[k], shapes[1][k].dtype)
                         for k in _EMPTY if k in shapes[1]})

        def accumulate(carry, mb):
            grads, metrics = carry
            g, m = grads_and_metrics(mb)
            merged = {k: _MERGE.get(k, jnp.add)(metrics[k], v) for k, v in m.items()}
            return (jax.tree.map(jnp.add, grads, g), merged), None

        (grads, metrics), _ = jax.lax.scan(accumulate, empty, micro)

    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(grad_norm) & jnp.isfinite(metrics["loss"])
    updates, new_opt = step.transformation.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
    new_state = TrainState(
        step=state.step + finite.astype(jnp.int32), params=keep(new_params, state.params),
        opt_state=keep(new_opt, state.opt_state), skipped=state.skipped + (~finite).astype(jnp.int32))
    metrics = dict(metrics, grad_norm=grad_norm, skipped=(~finite).astype(jnp.float32),
                   tokens=denominators["tokens"])
    return new_state, metrics


def _lora_loss(loss_fn: Callable, step: _Step, base) -> Callable:
    """`loss_fn` of the adapters: the base merged with them, in the model's compute dtype."""
    def loss(adapters, *args):
        return loss_fn(lora_lib.merge(base, adapters, step.lora, dtype=step.model_config.compute_dtype), *args)
    return loss


@functools.lru_cache(maxsize=64)
def _program(step: _Step, num_positions: int | None, keys: tuple = tuple(BATCH_AXES)):
    """The jitted update of one scored-positions bucket and batch entries (`keys`), explicit
    shardings, state donated (memoised: a jitted function keeps its compiled executables)."""
    shardings = {}
    if step.mesh is not None:
        st_sh = state_shardings(step.model_config, step.transformation, step.mesh, step.rules, step.lora)
        full_sh = param_shardings(step.model_config, step.mesh, step.rules)
        # The extra argument: the reference's parameters (with_reference), or LoRA's base.
        extra = (full_sh,) if step.with_reference or step.lora is not None else ()
        in_sh = (st_sh, batch_shardings(step.mesh, step.rules, keys)) + extra
        shardings = dict(in_shardings=in_sh, out_shardings=(st_sh, NamedSharding(step.mesh, PartitionSpec())))
    def update(state, batch, *frozen):  # (), (the reference's params,) or (LoRA's base,)
        with kernel_mesh(step.mesh, step.rules):  # fused attention kernels run per device under shard_map
            if step.lora is not None:
                return _update(step, num_positions, state, batch, base=frozen[0])
            return _update(step, num_positions, state, batch, *frozen)

    return jax.jit(update, donate_argnums=(0,), **shardings)


@jax.jit
def _max_masked(mask_BT):
    return jnp.max(jnp.sum(mask_BT > 0, axis=1))


def _scored_positions(batch, score_masked_only: bool) -> int | None:
    """The scored positions a row (the bucket of the largest masked count), or None: all."""
    if not score_masked_only:
        return None
    t = batch["tokens_BT"].shape[1]
    return min(t, pow2_bucket(int(_max_masked(batch["loss_mask_BT"])), 16, per_octave=2))


def _train_step(step: _Step, score_masked_only: bool) -> Callable:
    def train_step(state, batch, frozen=None):
        num_positions = _scored_positions(batch, score_masked_only)
        program = _program(step, num_positions, _batch_keys(batch))
        train_step.programs[num_positions] = program  # the variants this step used (tests count them)
        return program(state, batch, *_frozen_args(step, frozen))

    def lower(state, batch, frozen=None, *, num_positions: int | None = None):
        """The step's program lowered for these arguments (arrays or `jax.ShapeDtypeStruct`s
        with shardings) and `num_positions` scored positions a row (None: every position):
        its `.compile()` gives XLA's memory and cost analysis without running anything."""
        program = _program(step, num_positions if score_masked_only else None, _batch_keys(batch))
        return program.lower(state, batch, *_frozen_args(step, frozen))

    train_step.programs = {}
    train_step.lower = lower
    return train_step


def _frozen_args(step: _Step, frozen) -> tuple:
    """The compiled update's extra arguments: (frozen,) where the step reads frozen parameters
    (the KL reference, or LoRA's base), else ()."""
    needed = step.with_reference or step.lora is not None
    if needed and frozen is None:
        raise ValueError("this train step needs its frozen parameters (LoRA's base, or the KL reference "
                         "when kl_coef > 0): train_step(state, batch, frozen)")
    if not needed and frozen is not None:
        raise ValueError("this train step has no frozen parameters (no LoRA, kl_coef = 0): train_step(state, batch)")
    return (frozen,) if needed else ()


_MERGE = {"ratio_min": jnp.minimum, "ratio_max": jnp.maximum, "is_ratio_min": jnp.minimum,
          "is_ratio_max": jnp.maximum, **mismatch.MERGE}  # every other metric is a sum
_EMPTY = {"ratio_min": jnp.inf, "ratio_max": -jnp.inf, "is_ratio_min": jnp.inf, "is_ratio_max": -jnp.inf,
          **mismatch.EMPTY}  # what the merge starts from (else 0)


# ----------------------------------------------------------------------------- old log-probs


@dataclasses.dataclass(frozen=True)
class _Recompute:
    """What a compiled recompute pass depends on besides its arguments' shapes (hashable)."""

    model_config: Qwen3Config
    tis_cap: float
    keep_sampler_logp: bool  # MIS on recomputed old log-probs tests pi_old / pi_sampler
    num_micro_batches: int
    logprob_chunk: int | None
    mesh: Any
    rules: ShardingRules
    backend: Any


def make_old_logprob_step(model_config: Qwen3Config, *, tis_cap: float = 0.0, num_micro_batches: int = 1,
                          logprob_chunk: int | None = None, mesh=None, rules: ShardingRules = DEFAULT_RULES,
                          score_masked_only: bool = True, backend=None,
                          correction: Correction | None = None) -> Callable:
    """Builds `recompute(params, batch) -> (batch, metrics)`, jitted (programs memoised, so
    building it every step compiles nothing again).

    Run on every mini-batch of a rollout batch before its first update: the trainer's log-probs
    of the trained tokens under `params` replace the sampler's `old_logp_BT` (the PPO ratio's
    denominator, as verl's actor recomputes them); `metrics` are the sampler/trainer
    `rl.mismatch` metrics of the batch's trained tokens and their count (`tokens`). With
    `tis_cap` > 0 the batch gains `tis_weight_BT` = min(pi_trainer / pi_sampler, tis_cap).
    `correction` (a `losses.Correction`, the run's; it replaces `tis_cap`): with MIS on, the
    batch also keeps the sampler's log-probs (`sampler_logp_BT`) for the loss's mask.
    Micro-batching, sharding, the scored positions and `backend` are as in `make_train_step`
    (pass the same, and the two compute the same log-probs).
    """
    correction = Correction(tis_cap=tis_cap) if correction is None else correction
    rc = _Recompute(model_config, float(correction.tis_cap), correction.mis != "off", num_micro_batches,
                    logprob_chunk, mesh, rules, backend or backends.current())

    def recompute(params, batch):
        return _recompute_program(rc, _scored_positions(batch, score_masked_only))(params, batch)

    return recompute


def _recompute(rc: _Recompute, num_positions, params, batch):
    batch = {k: batch[k] for k in BATCH_AXES}
    config = rc.backend.with_kernels(rc.model_config)

    def score(mb):
        return _logprobs(params, config, mb, num_positions, rc.logprob_chunk)[0]

    if rc.num_micro_batches == 1:
        logp = score(batch)
    else:  # one micro-batch's activations at a time, rows back in their order
        logp = jax.lax.map(score, _micro_batches(batch, rc.num_micro_batches))
        logp = logp.swapaxes(0, 1).reshape(batch["tokens_BT"].shape)
    mask, sampler = batch["loss_mask_BT"], batch["old_logp_BT"]
    logp = jax.lax.stop_gradient(jnp.where(mask > 0, logp, 0.0))
    metrics = dict(mismatch.mismatch_metrics(logp, sampler, mask), tokens=jnp.sum(mask > 0).astype(jnp.float32))
    out = dict(batch, old_logp_BT=logp)
    if rc.tis_cap > 0:
        out["tis_weight_BT"] = mismatch.tis_weights(logp, sampler, mask, rc.tis_cap)
    if rc.keep_sampler_logp:
        out["sampler_logp_BT"] = sampler
    return out, metrics


@functools.lru_cache(maxsize=32)
def _recompute_program(rc: _Recompute, num_positions: int | None):
    shardings = {}
    if rc.mesh is not None:
        keys_out = (tuple(BATCH_AXES) + (("tis_weight_BT",) if rc.tis_cap > 0 else ())
                    + (("sampler_logp_BT",) if rc.keep_sampler_logp else ()))
        p_sh = param_shardings(rc.model_config, rc.mesh, rc.rules)
        shardings = dict(in_shardings=(p_sh, batch_shardings(rc.mesh, rc.rules)),
                         out_shardings=(batch_shardings(rc.mesh, rc.rules, keys_out),
                                        NamedSharding(rc.mesh, PartitionSpec())))
    def recompute(params, batch):
        with kernel_mesh(rc.mesh, rc.rules):  # fused attention kernels run per device under shard_map
            return _recompute(rc, num_positions, params, batch)
    return jax.jit(recompute, **shardings)
