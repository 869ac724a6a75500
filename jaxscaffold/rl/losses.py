"""Policy-gradient losses on token arrays: PPO-clip (with dual clip) and GSPO, in JAX.

Everything here sees arrays only: `logp_BT` (current policy, differentiable), `old_logp_BT`
(the policy that sampled the rollout), `adv_B` (one advantage per row, or `adv_BT`), and
`mask_BT` (1 on tokens the loss trains: model tokens of valid rows; 0 on prompt, environment
and padding tokens).

Aggregation (`agg`), with `m` the mask, `n_b` the valid tokens of row b, `N` the valid tokens
of the batch and `S` the rows with at least one valid token:

- `token-mean`:              sum(loss m) / N  (DAPO: every token of the batch weighs the same);
- `seq-mean-token-mean`:     sum_b [sum_t loss m / n_b] / S  (GRPO, GSPO);
- `seq-mean-token-sum`:      sum(loss m) / S;
- `seq-mean-token-sum-norm`: sum(loss m) / (S * agg_constant)  (Dr.GRPO, constant e.g. the max
  response length). This is the Dr.GRPO objective (1/G) sum_i sum_t / MAX_TOKENS and verl's
  definition since its fix that restored the sequence mean (verl PRs #5417, #6157); earlier
  verl releases divided only by the constant, which scales the loss with the batch size.

Exact gradient accumulation: every mode is a sum over rows of row-local terms divided by
batch-wide counts (N, S). Pass `denominators=loss_denominators(mask_BT_of_full_batch)` to
every micro-batch call and the sum of the micro-batch losses (and of their gradients) equals
the full-batch loss exactly; without it the local counts are used (right for one micro-batch).

Off-policy correction (`Correction`, the run's `rl.tis_cap` / `rl.mis*`): tokens sampled by an
older policy version (bounded staleness) or by the sampler's numerics are weighted (TIS) or
masked (MIS, `mis_keep`) by their importance ratio against the sampler. A masked token counts
in the aggregation's denominators (`mis_denominator="all"`, a TIS weight of 0) or leaves them
(`"kept"`, verl's rejection: the loss divides by the kept tokens' counts, which the train step
computes on the full batch, `mis_batch_keep`, so micro-batches stay exact).

Metrics are built the same way, so the train step combines micro-batches with
`merge_metrics` (a sum for every entry except `ratio_min` / `ratio_max`, which take min / max).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

if TYPE_CHECKING:  # the algorithm's config; presets.py validates its names against this module's
    from jaxscaffold.rl.presets import AlgorithmConfig

LOSS_MODES = ("ppo", "gspo")
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3")
MIS_MODES = ("off", "token", "sequence")
MIS_DENOMINATORS = ("all", "kept")

LOG_RATIO_CLAMP = 20.0  # PPO: exp of a larger log-ratio overflows and only adds noise
GSPO_LOG_RATIO_MAX = 10.0  # GSPO: upper clamp of the token log-ratio before exp, as verl
K3_VALUE_CLAMP = 10.0  # k3: verl's low_var_kl clamps the estimate to [-10, 10]


@dataclasses.dataclass(frozen=True)
class Correction:
    """The off-policy correction of tokens sampled by an older policy (a stale version, or the
    sampler's numerics): the run's `rl.tis_cap`, `rl.mis`, `rl.mis_lo`, `rl.mis_hi`.

    tis_cap: truncated importance sampling, token loss x min(pi_old / pi_sampler, cap) (0: off;
      the weights come with the recomputed old log-probs, `train_step.make_old_logprob_step`).
    mis: masked importance sampling ("off" | "token" | "sequence", `mis_keep`): the loss of a
      token (or of every token of a row) whose importance ratio pi / pi_sampler leaves
      [mis_lo, mis_hi] is masked (its loss and gradient 0).
    mis_denominator: "all": a masked token still counts in the aggregation's denominators (the
      batch's step shrinks with what MIS masks); "kept": it leaves them, every loss term then
      aggregated over the kept tokens only (verl's rejection mask). "kept" needs the trainer's
      old log-probs (the mask is then fixed before the update: its counts are the batch's).
    """

    tis_cap: float = 0.0
    mis: str = "off"
    mis_lo: float = 0.5
    mis_hi: float = 2.0
    mis_denominator: str = "all"

    def __post_init__(self):
        if self.mis not in MIS_MODES:
            raise ValueError(f"unknown mis {self.mis!r}; expected one of {MIS_MODES}")
        if self.tis_cap < 0:
            raise ValueError(f"tis_cap must be >= 0 (0: off), got {self.tis_cap}")
        if not 0.0 <= self.mis_lo < self.mis_hi:
            raise ValueError(f"MIS needs 0 <= mis_lo < mis_hi, got [{self.mis_lo}, {self.mis_hi}]")
        if self.mis_denominator not in MIS_DENOMINATORS:
            raise ValueError(f"unknown mis_denominator {self.mis_denominator!r}; expected one of {MIS_DENOMINATORS}")

    @property
    def drops_masked(self) -> bool:
        """Whether MIS's masked tokens leave the aggregation's denominators."""
        return self.mis != "off" and self.mis_denominator == "kept"


NO_CORRECTION = Correction()


def mis_keep(log_ratio_BT, mask_BT, mode: str, lo: float, hi: float):
    """1.0 where masked importance sampling keeps a token, 0.0 where it masks it (and on padding).

    token:    a token is kept when its ratio exp(log_ratio) lies in [lo, hi];
    sequence: every token of a row is kept when the row's ratio lies in [lo, hi], the row's
              ratio being the geometric mean of its tokens' ratios (exp of the mean log-ratio
              over its valid tokens, GSPO's sequence ratio): a product over thousands of
              tokens would leave any fixed band.
    "off" keeps every valid token. The log-ratio is clamped at +-20 (`LOG_RATIO_CLAMP`) first.
    """
    if mode not in MIS_MODES:
        raise ValueError(f"unknown mis {mode!r}; expected one of {MIS_MODES}")
    valid = jnp.asarray(mask_BT).astype(bool)
    lr_BT = jnp.where(valid, jnp.clip(jnp.asarray(log_ratio_BT, jnp.float32), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), 0.0)
    if mode == "off":
        return valid.astype(jnp.float32)
    if mode == "sequence":
        lr_B = lr_BT.sum(-1) / jnp.maximum(valid.sum(-1), 1)
        lr_BT = jnp.broadcast_to(lr_B[:, None], lr_BT.shape)
    ratio_BT = jnp.exp(lr_BT)
    return (valid & (ratio_BT >= lo) & (ratio_BT <= hi)).astype(jnp.float32)


def loss_denominators(mask_BT, kept_BT=None) -> dict:
    """The batch-wide counts every aggregation divides by: {"tokens": N, "seqs": S}; with
    `kept_BT` (`mis_batch_keep`) also "kept_tokens" / "kept_seqs", those of the tokens MIS
    keeps, which the loss divides by with `mis_denominator="kept"`.

    Compute them once on the FULL batch and pass them to each micro-batch's `policy_loss`.
    """
    m = jnp.asarray(mask_BT).astype(jnp.float32)
    out = {"tokens": m.sum(), "seqs": (m.sum(-1) > 0).sum().astype(jnp.float32)}
    if kept_BT is not None:
        kept = loss_denominators(m * jnp.asarray(kept_BT, jnp.float32))
        out.update(kept_tokens=kept["tokens"], kept_seqs=kept["seqs"])
    return out


def mis_batch_keep(mask_BT, old_logp_BT, sampler_logp_BT, correction: Correction):
    """MIS's keep mask of a whole batch when its counts are the loss's denominators
    (`correction.drops_masked`), else None. The ratio is pi_old / pi_sampler: the trainer's
    recomputed old log-probs against the sampler's, fixed for the whole update."""
    if not correction.drops_masked:
        return None
    if sampler_logp_BT is None:
        raise ValueError("mis_denominator='kept' needs the trainer's old log-probs beside the sampler's "
                         "(rl.recompute_old_logprobs=True)")
    valid = jnp.asarray(mask_BT).astype(bool)
    dtype = jnp.float32
    log_ratio = _masked(old_logp_BT, valid, dtype) - _masked(sampler_logp_BT, valid, dtype)
    return mis_keep(log_ratio, valid, correction.mis, correction.mis_lo, correction.mis_hi)


def aggregate(x_BT, mask_BT, agg: str = "token-mean", *, denominators=None, agg_constant=None):
    """Reduces a per-token array to a scalar with one of `AGG_MODES` (module docstring)."""
    if agg not in AGG_MODES:
        raise ValueError(f"unknown agg {agg!r}; expected one of {AGG_MODES}")
    if agg == "seq-mean-token-sum-norm" and agg_constant is None:
        raise ValueError("agg='seq-mean-token-sum-norm' needs agg_constant (e.g. the max response length)")
    if denominators is None:
        denominators = loss_denominators(mask_BT)
    valid = jnp.asarray(mask_BT).astype(bool)
    # where, not multiply: padded positions may hold inf / nan that must not leak into sums.
    x_BT = jnp.where(valid, x_BT, 0.0)
    # Clamped at 1 so an all-padding (micro-)batch gives 0 instead of nan.
    n_tok = jnp.maximum(jnp.asarray(denominators["tokens"], x_BT.dtype), 1.0)
    n_seq = jnp.maximum(jnp.asarray(denominators["seqs"], x_BT.dtype), 1.0)
    if agg == "token-mean":
        return x_BT.sum() / n_tok
    if agg == "seq-mean-token-mean":
        len_B = jnp.maximum(valid.sum(-1).astype(x_BT.dtype), 1.0)
        return (x_BT.sum(-1) / len_B).sum() / n_seq
    if agg == "seq-mean-token-sum":
        return x_BT.sum() / n_seq
    return x_BT.sum() / (n_seq * agg_constant)


def token_pg_loss(
    logp_BT,
    old_logp_BT,
    adv_B,
    mask_BT,
    *,
    loss_mode: str = "ppo",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = None,
):
    """Per-token clipped surrogate loss and the importance ratio it used: (loss_BT, ratio_BT).

    ppo:  r = exp(clamp(logp - old_logp, -20, 20)) per token.
    gspo: r = the sequence ratio exp(mean over valid tokens of (logp - old_logp)), in the token
          form exp(logp - sg(logp) + sg(seq log-ratio)) clamped at log 10 before exp: its value
          is the sequence ratio, its gradient flows through each token's own logp.
    Both: loss = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)); with `clip_c` (ppo only,
    dual clip) tokens with A < 0 take min(that, -A clip_c).
    """
    if loss_mode not in LOSS_MODES:
        raise ValueError(f"unknown loss_mode {loss_mode!r}; expected one of {LOSS_MODES}")
    if clip_c is not None:
        if loss_mode != "ppo":
            raise ValueError("dual clip (clip_c) is defined for loss_mode='ppo' only")
        if isinstance(clip_c, (int, float)) and clip_c <= 1.0:
            raise ValueError(f"dual clip needs clip_c > 1, got {clip_c}")
    dtype = jnp.promote_types(jnp.asarray(logp_BT).dtype, jnp.float32)
    valid = jnp.asarray(mask_BT).astype(bool)
    logp_BT = _masked(logp_BT, valid, dtype)
    old_logp_BT = _masked(old_logp_BT, valid, dtype)
    adv_BT = jnp.where(valid, _adv_per_token(adv_B, logp_BT.shape, dtype), 0.0)

    if loss_mode == "ppo":
        ratio_BT = jnp.exp(jnp.clip(logp_BT - old_logp_BT, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    else:
        seq_log_ratio_B = (logp_BT - old_logp_BT).sum(-1) / jnp.maximum(valid.sum(-1), 1)
        sg = jax.lax.stop_gradient
        log_s_BT = logp_BT - sg(logp_BT) + sg(seq_log_ratio_B)[:, None]
        ratio_BT = jnp.exp(jnp.minimum(log_s_BT, GSPO_LOG_RATIO_MAX))

    unclipped_BT = -adv_BT * ratio_BT
    clipped_BT = -adv_BT * jnp.clip(ratio_BT, 1.0 - clip_low, 1.0 + clip_high)
    loss_BT = jnp.maximum(unclipped_BT, clipped_BT)
    if clip_c is not None:
        loss_BT = jnp.where(adv_BT < 0, jnp.minimum(loss_BT, -adv_BT * clip_c), loss_BT)
    return loss_BT, ratio_BT


def _masked(x_BT, valid_BT, dtype):
    """Zero on padding *before* any math: nan / inf there would poison exp's backward pass."""
    return jnp.where(valid_BT, jnp.asarray(x_BT, dtype), 0.0)


def _adv_per_token(adv_B, shape_BT, dtype):
    """A per-row advantage is spread uniformly over the row's tokens."""
    adv = jnp.asarray(adv_B, dtype)
    return jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, shape_BT)


def kl_penalty(logp_BT, ref_logp_BT, estimator: str = "k1"):
    """Per-token estimate of KL(pi || pi_ref) from samples of pi, `lr = logp - ref_logp`.

    k1: lr (unbiased, high variance, can be negative);  k2: 0.5 lr^2;
    k3: exp(-lr) + lr - 1 (unbiased, >= 0; verl's low_var_kl: -lr clamped to [-20, 20] before
        exp, the estimate clamped to [-10, 10]).

    Two uses: in the loss (`policy_loss(ref_logp_BT=...)` with the algorithm's `kl_coef`, GRPO
    style, usually k3);
    or in the reward (PPO style), where the train step subtracts
    `kl_coef * kl_penalty(old_logp_BT, ref_logp_BT, "k1")` from the per-token rewards of the
    rollout policy before computing scores and advantages.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_estimator {estimator!r}; expected one of {KL_ESTIMATORS}")
    dtype = jnp.promote_types(jnp.asarray(logp_BT).dtype, jnp.float32)
    lr_BT = jnp.asarray(logp_BT, dtype) - jnp.asarray(ref_logp_BT, dtype)
    if estimator == "k1":
        return lr_BT
    if estimator == "k2":
        return 0.5 * jnp.square(lr_BT)
    neg_lr_BT = jnp.clip(-lr_BT, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return jnp.clip(jnp.exp(neg_lr_BT) - neg_lr_BT - 1.0, -K3_VALUE_CLAMP, K3_VALUE_CLAMP)


def policy_loss(
    logp_BT,
    old_logp_BT,
    adv_B,
    mask_BT,
    algo: AlgorithmConfig,
    *,
    ref_logp_BT=None,
    entropy_BT=None,
    denominators=None,
    tis_weight_BT=None,
    sampler_logp_BT=None,
):
    """The clipped policy loss of one (micro-)batch and its metrics: (loss, metrics).

    loss = agg(token_pg_loss) + kl_coef * agg(kl_penalty(logp, ref_logp, kl_estimator))
           - entropy_coef * agg(entropy_BT)
    with every setting from `algo`. Jit-able with `algo` static (a frozen dataclass);
    differentiable w.r.t. `logp_BT`.

    Args:
      logp_BT, old_logp_BT: log-probs of the sampled tokens under the current / rollout policy.
      adv_B: advantages, one per row (or per token, `[B, T]`).
      mask_BT: 1 where the token is trained on.
      algo: the algorithm (`rl.presets.AlgorithmConfig`, a preset with the run's overrides):
        loss_mode "ppo" or "gspo" (see `token_pg_loss`) and its clip_low / clip_high / clip_c;
        agg, one of `AGG_MODES`, and agg_constant, the constant of "seq-mean-token-sum-norm";
        kl_coef and kl_estimator of the KL-to-reference term; entropy_coef, the bonus weight;
        correction, the off-policy `Correction`: with `correction.mis` on, the surrogate loss
        of the tokens `mis_keep` masks is zeroed. Its ratio is pi_old / pi_sampler with
        `sampler_logp_BT` (old log-probs recomputed by the trainer, decoupled as TIS), else
        the current policy's against `old_logp_BT` (the sampler's, of the version that
        sampled), without gradient either way. With `mis_denominator="kept"` every loss term
        is aggregated over the kept tokens, divided by `denominators`' kept counts (computed
        here from this batch without `denominators`).
      ref_logp_BT: the reference policy's log-probs (the KL term; off when None).
      entropy_BT: per-token entropies computed by the caller (the entropy bonus; None: off).
      denominators: `loss_denominators` of the full batch for exact gradient accumulation.
      tis_weight_BT: truncated importance-sampling weights (`rl.mismatch.tis_weights`), each
        token's surrogate loss multiplied by its weight (a constant: no gradient); None = off.
      sampler_logp_BT: the sampler's log-probs when `old_logp_BT` are the trainer's.

    Metrics (scalars; token means over valid tokens with the same denominators, so summing
    micro-batch metrics gives the full-batch value, see `merge_metrics`):
      loss, pg_loss (the aggregated surrogate), clipfrac_upper (A > 0 and r > 1 + clip_high),
      clipfrac_lower (A < 0 and r < 1 - clip_low), clipfrac_dual (A < 0 and -A r > -A clip_c,
      i.e. r > clip_c; 0 without dual clip), approx_kl (k3 estimate of KL(pi_old || pi):
      (r - 1) - log r with the per-token ratio, unbiased under rollout samples, >= 0),
      ratio_mean, ratio_min, ratio_max (ratio used by the loss: per token for ppo, per
      sequence for gspo), kl (with a reference: token mean of the estimator), entropy (if given),
      tis_weight_mean (with TIS weights: their token mean); with MIS on: is_ratio_mean,
      is_ratio_min, is_ratio_max (the ratio MIS tests, per token) and mis_masked (the share of
      valid tokens masked).
    """
    loss_mode, clip_low, clip_high, clip_c = algo.loss_mode, algo.clip_low, algo.clip_high, algo.clip_c
    kl_coef, entropy_coef, correction = algo.kl_coef, algo.entropy_coef, algo.correction
    if denominators is None:
        kept = mis_batch_keep(mask_BT, old_logp_BT, sampler_logp_BT, correction)
        denominators = loss_denominators(mask_BT, kept)
    if ref_logp_BT is None and not (isinstance(kl_coef, (int, float)) and kl_coef == 0):
        raise ValueError("kl_coef is set but ref_logp_BT is None")
    if correction.drops_masked and "kept_tokens" not in denominators:
        raise ValueError("mis_denominator='kept': pass the full batch's loss_denominators(mask, mis_batch_keep(...))")
    agg_fn = functools.partial(
        aggregate, mask_BT=mask_BT, agg=algo.agg, denominators=denominators, agg_constant=algo.agg_constant
    )
    token_mean = functools.partial(aggregate, mask_BT=mask_BT, agg="token-mean", denominators=denominators)

    dtype = jnp.promote_types(jnp.asarray(logp_BT).dtype, jnp.float32)
    valid = jnp.asarray(mask_BT).astype(bool)
    logp_BT = _masked(logp_BT, valid, dtype)
    old_logp_BT = _masked(old_logp_BT, valid, dtype)

    loss_BT, ratio_BT = token_pg_loss(
        logp_BT, old_logp_BT, adv_B, mask_BT,
        loss_mode=loss_mode, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c,
    )  # fmt: skip
    metrics = {}
    if tis_weight_BT is not None:
        tis_weight_BT = jax.lax.stop_gradient(_masked(tis_weight_BT, valid, dtype))
        loss_BT = loss_BT * tis_weight_BT
        metrics["tis_weight_mean"] = token_mean(tis_weight_BT)
    if correction.mis != "off":
        sg = jax.lax.stop_gradient
        if sampler_logp_BT is None:
            is_log_ratio_BT = sg(logp_BT) - old_logp_BT
        else:
            is_log_ratio_BT = old_logp_BT - _masked(sampler_logp_BT, valid, dtype)
        is_log_ratio_BT = sg(jnp.clip(is_log_ratio_BT, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        keep_BT = mis_keep(is_log_ratio_BT, valid, correction.mis, correction.mis_lo, correction.mis_hi)
        loss_BT = loss_BT * keep_BT.astype(dtype)
        is_ratio_BT = jnp.exp(is_log_ratio_BT)
        if correction.drops_masked:  # verl: the masked tokens leave every term's counts
            agg_fn = functools.partial(aggregate, mask_BT=keep_BT, agg=algo.agg, agg_constant=algo.agg_constant,
                                       denominators={"tokens": denominators["kept_tokens"],
                                                     "seqs": denominators["kept_seqs"]})
        metrics.update(is_ratio_mean=token_mean(is_ratio_BT),
                       is_ratio_min=jnp.min(jnp.where(valid, is_ratio_BT, jnp.inf)),
                       is_ratio_max=jnp.max(jnp.where(valid, is_ratio_BT, -jnp.inf)),
                       mis_masked=token_mean(1.0 - keep_BT.astype(dtype)))
    pg_loss = agg_fn(loss_BT)
    loss = pg_loss
    if ref_logp_BT is not None:
        kl_BT = kl_penalty(logp_BT, _masked(ref_logp_BT, valid, dtype), algo.kl_estimator)
        loss = loss + kl_coef * agg_fn(kl_BT)
        metrics["kl"] = token_mean(kl_BT)
    if entropy_BT is not None:
        entropy_BT = _masked(entropy_BT, valid, dtype)
        loss = loss - entropy_coef * agg_fn(entropy_BT)
        metrics["entropy"] = token_mean(entropy_BT)

    # Metrics carry no gradient; flags are 0/1 per token, averaged like the loss.
    sg = jax.lax.stop_gradient
    ratio_BT = sg(ratio_BT)
    adv_BT = _adv_per_token(adv_B, ratio_BT.shape, dtype)
    upper_BT = (adv_BT > 0) & (ratio_BT > 1.0 + clip_high)
    lower_BT = (adv_BT < 0) & (ratio_BT < 1.0 - clip_low)
    dual_BT = (adv_BT < 0) & (ratio_BT > clip_c) if clip_c is not None else jnp.zeros_like(upper_BT)
    log_r_BT = jnp.clip(sg(logp_BT - old_logp_BT), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    metrics.update(
        loss=sg(loss),
        pg_loss=sg(pg_loss),
        clipfrac_upper=token_mean(upper_BT.astype(dtype)),
        clipfrac_lower=token_mean(lower_BT.astype(dtype)),
        clipfrac_dual=token_mean(dual_BT.astype(dtype)),
        approx_kl=token_mean(jnp.expm1(log_r_BT) - log_r_BT),
        ratio_mean=token_mean(ratio_BT),
        ratio_min=jnp.min(jnp.where(valid, ratio_BT, jnp.inf)),
        ratio_max=jnp.max(jnp.where(valid, ratio_BT, -jnp.inf)),
    )
    metrics = {k: sg(v) for k, v in metrics.items()}
    return loss, metrics


def merge_metrics(metrics_list):
    """Combines per-micro-batch metrics computed with the full batch's `denominators`.

    Everything is a sum over micro-batches except the ratios' min / max.
    """
    reducers = {"ratio_min": jnp.minimum, "ratio_max": jnp.maximum,
                "is_ratio_min": jnp.minimum, "is_ratio_max": jnp.maximum}
    merged = dict(metrics_list[0])
    for metrics in metrics_list[1:]:
        for k, v in metrics.items():
            merged[k] = reducers.get(k, jnp.add)(merged[k], v)
    return merged
