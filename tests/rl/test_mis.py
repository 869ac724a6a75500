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


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("mode", ["token", "sequence"])
def test_mis_denominator_kept_drops_masked_tokens_from_the_counts(mode, agg):
    """verl's rejection (`mis_denominator="kept"`): the loss is the reference's aggregation
    over the kept tokens only (a row with none left leaves the sequence count); the ratio is
    pi_old / pi_sampler (recomputed old log-probs), and micro-batches given the full batch's
    counts add up to the full batch's loss and gradient."""
    logp, old = batch()
    sampler = np.where(MASK > 0, old - PPO_LOG_RATIO, 0.0)  # old / sampler: the band splits it
    correction = losses.Correction(mis=mode, mis_lo=LO, mis_hi=HI, mis_denominator="kept")
    keep = ref_keep(old - sampler, MASK, mode, LO, HI)
    assert 0 < keep.sum() < MASK.sum()

    def f(x, rows=slice(None), denominators=None):
        return losses.policy_loss(x, jnp.asarray(old[rows], jnp.float32), ADV[rows], MASK[rows],
                                  algo(loss_mode="ppo", clip_low=0.2, clip_high=0.28, clip_c=3.0, agg=agg,
                                       agg_constant=AGG_CONSTANT, correction=correction),
                                  sampler_logp_BT=jnp.asarray(sampler[rows], jnp.float32),
                                  denominators=denominators)

    (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logp, jnp.float32))
    tl, _, tg = ref.token_loss_and_grad(logp, old, ADV, MASK, "ppo", 0.2, 0.28, 3.0)
    w = ref.agg_weights(MASK * keep, agg, AGG_CONSTANT)  # the counts of the kept tokens
    np.testing.assert_allclose(float(loss), float((w * tl).sum()), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), w * tg, rtol=1e-5, atol=1e-6)
    # The share masked is still of every trained token (the metric's counts are the batch's).
    np.testing.assert_allclose(float(metrics["mis_masked"]), 1.0 - keep[MASK > 0].mean(), rtol=1e-6)
    # "all" divides by every token: a different loss whenever something is masked.
    all_counts, _ = losses.policy_loss(jnp.asarray(logp, jnp.float32), jnp.asarray(old, jnp.float32), ADV, MASK,
                                       algo(clip_low=0.2, clip_high=0.28, clip_c=3.0, agg=agg, agg_constant=AGG_CONSTANT,
                                            correction=losses.Correction(mis=mode, mis_lo=LO, mis_hi=HI)),
                                       sampler_logp_BT=jnp.asarray(sampler, jnp.float32))
    assert abs(float(all_counts) - float(loss)) > 1e-4
    # Exact accumulation: two micro-batches with the full batch's counts.
    full = losses.loss_denominators(MASK, losses.mis_batch_keep(MASK, old, sampler, correction))
    parts = [jax.value_and_grad(lambda x, r=r: f(x, r, full), has_aux=True)(jnp.asarray(logp[r], jnp.float32))
             for r in (slice(0, 3), slice(3, None))]
    np.testing.assert_allclose(sum(float(l) for (l, _), _ in parts), float(loss), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.concatenate([np.asarray(g) for _, g in parts]), np.asarray(grad), atol=1e-6)
    with pytest.raises(ValueError, match="full batch's loss_denominators"):
        f(jnp.asarray(logp, jnp.float32), denominators=losses.loss_denominators(MASK))


def test_mis_denominator_kept_needs_recomputed_old_logprobs():
    logp, old = batch()
    correction = losses.Correction(mis="token", mis_lo=LO, mis_hi=HI, mis_denominator="kept")
    with pytest.raises(ValueError, match="recompute_old_logprobs"):
        losses.policy_loss(jnp.asarray(logp, jnp.float32), jnp.asarray(old, jnp.float32), ADV, MASK,
                           algo(correction=correction))
    with pytest.raises(ValueError, match="mis_denominator"):
        losses.Correction(mis="token", mis_denominator="some")


def test_the_train_step_divides_by_the_full_batchs_kept_counts():
    """mis_denominator="kept" in the jitted step: 1 micro-batch or 4, the same update (the
    kept counts are the full batch's), and not the update of "all"."""
    import optax

    from jaxscaffold.models import qwen3
    from jaxscaffold.rl.presets import preset
    from jaxscaffold.rl.train_step import init_train_state, make_train_step
    from tests.rl.test_train_step import CONFIG, _batch, _rel_diff

    b = _batch(1)
    rng = np.random.RandomState(2)
    b["sampler_logp_BT"] = ((b["old_logp_BT"] + rng.randn(*b["old_logp_BT"].shape) * 0.4)
                            * b["loss_mask_BT"]).astype(np.float32)
    params = qwen3.init_params(CONFIG, jax.random.key(0))

    def update(n, denominator):
        sgd = optax.sgd(1.0)
        correction = losses.Correction(mis="token", mis_lo=LO, mis_hi=HI, mis_denominator=denominator)
        step = make_train_step(CONFIG, preset("grpo", correction=correction), sgd, num_micro_batches=n)
        state, metrics = step(init_train_state(jax.tree.map(jnp.copy, params), sgd), b)
        return jax.tree.map(lambda x, y: np.asarray(x) - np.asarray(y), state.params, params), metrics

    (u1, m1), (u4, _), (ua, _) = update(1, "kept"), update(4, "kept"), update(1, "all")
    assert 0 < float(m1["mis_masked"]) < 1
    assert _rel_diff(u1, u4) < 1e-5
    assert _rel_diff(u1, ua) > 1e-3


def test_the_config_says_kept_needs_the_trainers_old_logprobs(tmp_path):
    from jaxscaffold import config as config_lib
    from tests.train.configs import tiny_config

    kept = {"rl.mis": "token", "rl.mis_denominator": "kept"}
    with pytest.raises(config_lib.ConfigError, match="mis_denominator='kept'.*recompute_old_logprobs"):
        config_lib.typed(tiny_config(tmp_path, **kept, **{"rl.recompute_old_logprobs": False}))
    cfg = config_lib.typed(tiny_config(tmp_path, **kept, **{"rl.recompute_old_logprobs": True}))
    assert cfg.rl.mis_denominator == "kept"
