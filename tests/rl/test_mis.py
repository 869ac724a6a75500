"""Masked importance sampling (`rl.mis`) against a plain-loop NumPy reference written from the
definition: a token (or a whole row, by its geometric-mean ratio) whose ratio pi / pi_sampler
leaves [lo, hi] contributes no loss and no gradient; the aggregation's counts stay the same."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxscaffold.rl import losses
from tests.rl import numpy_reference as ref
from tests.rl.test_losses import ADV, AGG_CONSTANT, MASK, PPO_LOG_RATIO, algo

LO, HI = 0.8, 1.3


def ref_keep(log_ratio, mask, mode, lo, hi):
    """1/0 per token, one loop per row and token."""
    B, T = mask.shape
    keep = np.zeros((B, T))
    for b in range(B):
        valid = [t for t in range(T) if mask[b, t]]
        if mode == "sequence":
            mean_lr = sum(log_ratio[b, t] for t in valid) / len(valid) if valid else 0.0
            kept = lo <= math.exp(mean_lr) <= hi
        for t in valid:
            if mode == "token":
                keep[b, t] = float(lo <= math.exp(log_ratio[b, t]) <= hi)
            elif mode == "sequence":
                keep[b, t] = float(kept)
            else:
                keep[b, t] = 1.0
    return keep


def ref_mis_loss(logp, old, adv, mask, keep, agg):
    """The PPO loss (dual clip 3) and gradient with every masked token's term dropped."""
    tl, _, tg = ref.token_loss_and_grad(logp, old, adv, mask, "ppo", 0.2, 0.28, 3.0)
    w = ref.agg_weights(mask, agg, AGG_CONSTANT)  # the counts of the unmasked batch
    loss = sum(w[b, t] * keep[b, t] * tl[b, t] for b in range(mask.shape[0]) for t in range(mask.shape[1]))
    return loss, w * keep * tg


def batch():
    rng = np.random.RandomState(1)
    logp = np.where(MASK > 0, rng.uniform(-3.0, -0.1, MASK.shape), 0.0)
    return logp, np.where(MASK > 0, logp - PPO_LOG_RATIO, 0.0)


@pytest.mark.parametrize("mode", losses.MIS_MODES)
def test_mis_keep_matches_reference(mode):
    lr = np.where(MASK > 0, PPO_LOG_RATIO, 0.0)
    keep = np.asarray(losses.mis_keep(lr, MASK, mode, LO, HI))
    np.testing.assert_array_equal(keep, ref_keep(lr, MASK, mode, LO, HI))
    if mode != "off":  # the band is chosen so that both outcomes occur
        assert 0 < keep[MASK > 0].sum() < (MASK > 0).sum()


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("mode", ["token", "sequence"])
def test_mis_loss_gradient_and_metrics_match_reference(mode, agg):
    """Without recomputed old log-probs the ratio MIS tests is the loss's own (current policy
    against the sampler's log-probs of the version that sampled)."""
    logp, old = batch()
    correction = losses.Correction(mis=mode, mis_lo=LO, mis_hi=HI)

    def f(x):
        return losses.policy_loss(x, jnp.asarray(old, jnp.float32), ADV, MASK, algo(loss_mode="ppo", clip_low=0.2,
                                  clip_high=0.28, clip_c=3.0, agg=agg, correction=correction))

    (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logp, jnp.float32))
    keep = ref_keep(logp - old, MASK, mode, LO, HI)
    ref_loss, ref_grad = ref_mis_loss(logp, old, ADV, MASK, keep, agg)
    np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), ref_grad, rtol=1e-5, atol=1e-6)
    valid = MASK > 0
    ratio = np.exp(logp - old)[valid]
    np.testing.assert_allclose(float(metrics["mis_masked"]), 1.0 - keep[valid].mean(), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["is_ratio_mean"]), ratio.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["is_ratio_min"]), ratio.min(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["is_ratio_max"]), ratio.max(), rtol=1e-5)


def test_mis_with_recomputed_old_logprobs_tests_old_over_sampler():
    """With the sampler's log-probs beside recomputed old ones, MIS tests pi_old / pi_sampler
    (decoupled, as TIS): the PPO ratio may be 1 everywhere and tokens still be masked."""
    logp, _ = batch()
    sampler = np.where(MASK > 0, logp - PPO_LOG_RATIO, 0.0)
    correction = losses.Correction(mis="token", mis_lo=LO, mis_hi=HI)
    loss, metrics = losses.policy_loss(jnp.asarray(logp, jnp.float32), jnp.asarray(logp, jnp.float32), ADV, MASK,
                                       algo(clip_c=3.0, clip_high=0.28, agg="token-mean", correction=correction),
                                       sampler_logp_BT=jnp.asarray(sampler, jnp.float32))
    keep = ref_keep(logp - sampler, MASK, "token", LO, HI)
    ref_loss, _ = ref_mis_loss(logp, logp, ADV, MASK, keep, "token-mean")
    np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5, atol=1e-6)
    assert 0 < float(metrics["mis_masked"]) < 1


def test_mis_off_is_the_uncorrected_loss_and_bad_settings_are_errors():
    logp, old = batch()
    args = (jnp.asarray(logp, jnp.float32), jnp.asarray(old, jnp.float32), ADV, MASK)
    plain, m0 = losses.policy_loss(*args, algo())
    off, m1 = losses.policy_loss(*args, algo(correction=losses.Correction(mis="off")))
    assert float(plain) == float(off) and set(m0) == set(m1) and "mis_masked" not in m1
    with pytest.raises(ValueError, match="mis"):
        losses.Correction(mis="tokens")
    with pytest.raises(ValueError, match="mis_lo < mis_hi"):
        losses.Correction(mis="token", mis_lo=2.0, mis_hi=1.0)
