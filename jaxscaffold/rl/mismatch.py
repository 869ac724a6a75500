"""The sampler / trainer mismatch on the trained tokens, and truncated importance sampling.

The sampler (KV-cache decoding, its own programs and dtypes) and the trainer (teacher-forced
forward pass) compute the log-probs of one token under the same parameters slightly
differently. GSPO's clip (3e-4 / 4e-4 on a sequence ratio) is narrower than that difference
can be, so it is measured every step. With `r = pi_trainer / pi_sampler` per trained token,
sampled from the sampler:

  mismatch_kl         token mean of the k3 estimate `(r - 1) - log r` of KL(sampler || trainer)
                      (unbiased under the sampler's samples, >= 0);
  mismatch_ratio_max  / mismatch_ratio_min   the extreme token ratios.

Truncated importance sampling (TIS, Yao et al. 2025 "Your efficient RL framework secretly
brings you off-policy RL training"; verl's `tis_imp_ratio_cap`): with the trainer's old
log-probs as the PPO ratio's denominator, each token's loss is weighted by
`min(pi_trainer_old / pi_sampler, cap)`, a constant (no gradient).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxscaffold.rl.losses import LOG_RATIO_CLAMP

MISMATCH_KEYS = ("mismatch_kl", "mismatch_ratio_max", "mismatch_ratio_min")
# How measurements of the parts of one batch combine: max / min, every other key a sum.
MERGE = {"mismatch_ratio_max": jnp.maximum, "mismatch_ratio_min": jnp.minimum}
EMPTY = {"mismatch_ratio_max": -jnp.inf, "mismatch_ratio_min": jnp.inf}  # a part without tokens


def _log_ratio(trainer_logp_BT, sampler_logp_BT, valid_BT):
    diff = jnp.asarray(trainer_logp_BT, jnp.float32) - jnp.asarray(sampler_logp_BT, jnp.float32)
    return jnp.where(valid_BT, jnp.clip(diff, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), 0.0)


def mismatch_metrics(trainer_logp_BT, sampler_logp_BT, mask_BT, *, num_tokens=None) -> dict:
    """The `MISMATCH_KEYS` of the tokens where `mask_BT` is 1 (no gradient).

    `num_tokens` (default: this mask's count) is what the KL's sum is divided by: with the whole
    batch's count, the values of its parts (micro-batches) combine by `MERGE` into the batch's."""
    valid = jnp.asarray(mask_BT) > 0
    log_r = jax.lax.stop_gradient(_log_ratio(trainer_logp_BT, sampler_logp_BT, valid))
    n = valid.sum().astype(jnp.float32) if num_tokens is None else jnp.asarray(num_tokens, jnp.float32)
    ratio = jnp.exp(log_r)
    return {
        "mismatch_kl": jnp.sum(jnp.where(valid, jnp.expm1(log_r) - log_r, 0.0)) / jnp.maximum(n, 1.0),
        "mismatch_ratio_max": jnp.max(jnp.where(valid, ratio, -jnp.inf)),
        "mismatch_ratio_min": jnp.min(jnp.where(valid, ratio, jnp.inf)),
    }


def tis_weights(trainer_logp_BT, sampler_logp_BT, mask_BT, cap: float):
    """`min(pi_trainer / pi_sampler, cap)` per trained token (0 elsewhere), without gradient."""
    if not cap > 0:
        raise ValueError(f"truncated importance sampling needs a cap > 0, got {cap}")
    valid = jnp.asarray(mask_BT) > 0
    log_r = _log_ratio(trainer_logp_BT, sampler_logp_BT, valid)
    return jax.lax.stop_gradient(jnp.where(valid, jnp.minimum(jnp.exp(log_r), cap), 0.0))
