"""Policy losses against the plain-loop NumPy reference, and the properties a bug would break."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxscaffold.rl import losses, presets
from jaxscaffold.rl.advantages import advantages
from tests.rl import numpy_reference as ref

AGGS = losses.AGG_MODES
AGG_CONSTANT = 7.0  # "max response length" of the sum-norm mode (any constant > 0)
GSPO_CLIP = dict(clip_low=3e-4, clip_high=4e-4)


def algo(**settings):
    """The algorithm a loss is computed for: these settings over plain PPO without dual clip,
    token-mean (a test's defaults, not a preset's)."""
    return presets.AlgorithmConfig(name="test", **{"agg": "token-mean", "clip_c": None, **settings})

# Hand-made batch: masked env token inside row 0, a single-token row 2, an empty row 5.
MASK = np.array(
    [
        [1, 1, 0, 1, 1],
        [1, 1, 1, 0, 0],
        [1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1],
        [1, 1, 0, 0, 0],
        [0, 0, 0, 0, 0],
    ],
    np.float32,
)
ADV = np.array([1.2, -0.7, 0.5, -1.5, 0.9, 0.4], np.float32)
# PPO log-ratios, clip 0.2 / 0.28 and dual clip 3: upper clip (0.5, 0.3), clip-higher band
# (0.22, 0.24: r in (1.2, 1.28)), lower clip (-0.5, -0.3 with A < 0), dual clip (1.3, 1.5 with
# A < 0), and unclipped tokens on both sides. Padding entries are never read.
PPO_LOG_RATIO = np.array(
    [
        [0.5, 0.22, 0.0, 0.05, -0.4],
        [-0.5, 1.3, 0.1, 0.0, 0.0],
        [0.3, 0.0, 0.0, 0.0, 0.0],
        [-0.3, 0.0, 1.5, 0.35, -0.1],
        [0.24, -0.25, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0],
    ]
)
# GSPO: per-row mean log-ratio (what the sequence ratio sees) plus zero-mean token noise.
# Rows: A>0 above 1+4e-4 (clipped), A<0 below 1-3e-4 (clipped), single token inside, A<0 above
# 1 (unclipped), A>0 below 1 (unclipped).
GSPO_SEQ_LR = np.array([1e-3, -1e-3, 2e-4, 2e-3, -1e-3, 0.0])
GSPO_NOISE = np.array(
    [
        [0.3, -0.2, 0.0, 0.1, -0.2],
        [0.25, -0.05, -0.2, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0],
        [0.1, -0.3, 0.2, 0.05, -0.05],
        [0.15, -0.15, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0],
    ]
)


def make_batch(mode):
    rng = np.random.RandomState(0)
    logp = rng.uniform(-3.0, -0.1, MASK.shape)
    lr = PPO_LOG_RATIO if mode == "ppo" else GSPO_SEQ_LR[:, None] + GSPO_NOISE
    old = logp - lr
    ref_logp = logp - rng.uniform(-1.0, 1.0, MASK.shape)
    entropy = rng.uniform(0.1, 2.0, MASK.shape)
    # Keep float64 copies for the reference (padding zeroed), float32 for JAX.
    return {k: np.where(MASK > 0, v, 0.0) for k, v in dict(logp=logp, old=old, ref=ref_logp, entropy=entropy).items()}


def mode_kwargs(mode):
    return dict(clip_low=0.2, clip_high=0.28, clip_c=3.0) if mode == "ppo" else dict(GSPO_CLIP)


def jax_loss_and_grad(batch, mode, agg, extras, *, poison_padding=False):
    settings, kw = dict(loss_mode=mode, agg=agg, agg_constant=AGG_CONSTANT, **mode_kwargs(mode)), {}
    if extras:
        settings.update(kl_coef=0.05, kl_estimator="k3", entropy_coef=0.01)
        kw.update(ref_logp_BT=jnp.asarray(batch["ref"], jnp.float32), entropy_BT=jnp.asarray(batch["entropy"], jnp.float32))
    logp = batch["logp"]
    if poison_padding:
        logp = np.where(MASK > 0, logp, np.nan)  # padding must never reach the loss or gradient

    def f(logp_BT):
        return losses.policy_loss(logp_BT, jnp.asarray(batch["old"], jnp.float32), ADV, MASK, algo(**settings), **kw)

    (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logp, jnp.float32))
    return float(loss), np.asarray(grad), {k: float(v) for k, v in metrics.items()}


def ref_loss_and_grad(batch, mode, agg, extras):
    kw = dict(mode=mode, agg=agg, agg_constant=AGG_CONSTANT, **mode_kwargs(mode))
    if extras:
        kw.update(ref=batch["ref"], kl_coef=0.05, kl_estimator="k3", entropy=batch["entropy"], entropy_coef=0.01)
    return ref.policy_loss(batch["logp"], batch["old"], ADV, MASK, **kw)


@pytest.mark.parametrize("extras", [False, True], ids=["pg", "pg+kl+entropy"])
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("mode", losses.LOSS_MODES)
def test_loss_grad_and_metrics_match_reference(mode, agg, extras):
    batch = make_batch(mode)
    loss, grad, metrics = jax_loss_and_grad(batch, mode, agg, extras, poison_padding=True)
    ref_loss, ref_grad, ref_metrics = ref_loss_and_grad(batch, mode, agg, extras)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-6)
    assert np.all(grad[MASK == 0] == 0)
    assert set(metrics) == set(ref_metrics)
    for k in ref_metrics:
        np.testing.assert_allclose(metrics[k], ref_metrics[k], rtol=1e-5, atol=1e-6, err_msg=k)
    # The batch is built so that every clipping branch is exercised.
    if mode == "ppo":
        assert min(metrics["clipfrac_upper"], metrics["clipfrac_lower"], metrics["clipfrac_dual"]) > 0
    else:
        assert min(metrics["clipfrac_upper"], metrics["clipfrac_lower"]) > 0


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("mode", losses.LOSS_MODES)
def test_reference_gradient_matches_finite_differences(mode, agg):
    """The hand-derived reference gradient (token form for GSPO) is the true gradient."""
    batch = make_batch(mode)
    _, grad, _ = ref_loss_and_grad(batch, mode, agg, extras=True)

    def loss_of(logp):
        return ref_loss_and_grad(dict(batch, logp=logp), mode, agg, extras=True)[0]

    fd = ref.finite_difference_grad(loss_of, batch["logp"], h=1e-6)
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)


def test_gspo_ratio_is_geometric_mean_of_token_ratios():
    batch = make_batch("gspo")
    _, ratio = losses.token_pg_loss(batch["logp"], batch["old"], ADV, MASK, loss_mode="gspo", **GSPO_CLIP)
    ratio = np.asarray(ratio)
    token_ratio = np.exp(batch["logp"] - batch["old"])
    for b in range(5):
        valid = MASK[b] > 0
        geo = np.prod(token_ratio[b, valid]) ** (1.0 / valid.sum())
        np.testing.assert_allclose(ratio[b, valid], geo, rtol=1e-6)
        np.testing.assert_allclose(geo, np.exp(GSPO_SEQ_LR[b]), rtol=1e-6)


def test_gspo_log_ratio_clamped_at_10_before_exp():
    logp = jnp.array([[-1.0, -2.0]])
    old = logp - 12.0  # sequence log-ratio 12 > 10
    loss_BT, ratio = losses.token_pg_loss(logp, old, jnp.array([-1.0]), jnp.ones((1, 2)), loss_mode="gspo")
    np.testing.assert_allclose(ratio, np.exp(10.0), rtol=1e-6)
    grad = jax.grad(lambda lp: losses.token_pg_loss(lp, old, jnp.array([-1.0]), jnp.ones((1, 2)),
                                                    loss_mode="gspo")[0].sum())(logp)  # fmt: skip
    assert np.all(np.asarray(grad) == 0)


def test_ppo_log_ratio_clamped_at_20():
    _, ratio = losses.token_pg_loss(jnp.array([[30.0, -30.0]]), jnp.zeros((1, 2)), jnp.ones(1), jnp.ones((1, 2)))
    np.testing.assert_allclose(ratio, np.exp([[20.0, -20.0]]), rtol=1e-6)


def test_equal_rewards_give_zero_advantage_and_zero_gradient():
    rng = np.random.RandomState(1)
    rewards = np.array([1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 1], np.float32)
    groups = np.repeat([0, 1, 2], 4)
    adv = advantages(rewards, groups, presets.preset("grpo"))
    assert np.all(adv[:8] == 0) and np.all(adv[8:] != 0)
    mask = (rng.uniform(size=(12, 6)) < 0.8).astype(np.float32)
    mask[:, 0] = 1
    logp = rng.uniform(-3, -0.1, (12, 6)).astype(np.float32)
    old = logp - rng.uniform(-0.5, 0.5, (12, 6)).astype(np.float32)

    @jax.jit
    def grad_for(adv_B):
        return jax.grad(lambda lp: losses.policy_loss(lp, old, adv_B, mask, algo(agg="seq-mean-token-mean",
                                                                                 clip_c=3.0))[0])(jnp.asarray(logp))

    g = np.asarray(grad_for(adv))
    assert np.all(g[:8] == 0) and np.any(g[8:] != 0)
    assert np.all(np.asarray(grad_for(advantages(np.ones(12), groups, presets.preset("grpo")))) == 0)


def test_clip_higher_changes_only_the_upper_side():
    batch = make_batch("ppo")

    def per_token(clip_high):
        def f(lp):
            return losses.token_pg_loss(lp, batch["old"], ADV, MASK, clip_low=0.2, clip_high=clip_high)[0]

        loss = np.asarray(f(jnp.asarray(batch["logp"], jnp.float32)))
        # Each token's loss depends on its own logp only, so the gradient of the sum is tokenwise.
        grad = np.asarray(jax.grad(lambda lp: (f(lp) * MASK).sum())(jnp.asarray(batch["logp"], jnp.float32)))
        return loss * MASK, grad

    sym_loss, sym_grad = per_token(0.2)
    hi_loss, hi_grad = per_token(0.28)
    r = np.exp(PPO_LOG_RATIO)
    upper_side = (MASK > 0) & (ADV[:, None] > 0) & (r > 1.2)  # where only the upper clip can bind
    np.testing.assert_array_equal(sym_loss[~upper_side], hi_loss[~upper_side])
    np.testing.assert_array_equal(sym_grad[~upper_side], hi_grad[~upper_side])
    assert np.all(sym_loss[upper_side] != hi_loss[upper_side])
    band = upper_side & (r < 1.28)  # clipped symmetric, free with clip-higher
    assert band.sum() == 2
    assert np.all(sym_grad[band] == 0) and np.all(hi_grad[band] != 0)
    assert np.any((ADV[:, None] < 0) & (MASK > 0) & (r < 0.8))  # the lower side did bind somewhere


@pytest.mark.parametrize("estimator", losses.KL_ESTIMATORS)
def test_kl_estimators_match_reference(estimator):
    lr = np.array([[-15.0, -3.0, -0.5, -1e-3, 0.0], [1e-3, 0.4, 2.0, 6.0, 25.0]])
    logp = np.full_like(lr, -1.0)
    ref_logp = logp - lr
    mask = np.ones_like(lr)
    want, want_d = ref.kl_and_grad(logp, ref_logp, mask, estimator)
    got = losses.kl_penalty(jnp.asarray(logp, jnp.float32), jnp.asarray(ref_logp, jnp.float32), estimator)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    d = jax.grad(lambda lp: losses.kl_penalty(lp, jnp.asarray(ref_logp, jnp.float32), estimator).sum())(
        jnp.asarray(logp, jnp.float32)
    )
    np.testing.assert_allclose(d, want_d, rtol=1e-5, atol=1e-6)
    if estimator == "k3":
        assert np.all(np.asarray(got) >= 0) and float(got[0, 0]) == 10.0  # clamped


@pytest.mark.parametrize("agg", AGGS)
def test_kl_and_entropy_terms_add_to_the_loss(agg):
    batch = make_batch("ppo")
    kw = dict(agg=agg, agg_constant=AGG_CONSTANT, clip_high=0.28, clip_c=3.0)
    args = (jnp.asarray(batch["logp"], jnp.float32), batch["old"], ADV, MASK)
    base, _ = losses.policy_loss(*args, algo(**kw))
    for est in losses.KL_ESTIMATORS:
        with_kl, m = losses.policy_loss(*args, algo(kl_coef=0.3, kl_estimator=est, **kw), ref_logp_BT=batch["ref"])
        kl_agg = losses.aggregate(losses.kl_penalty(batch["logp"], batch["ref"], est), MASK, agg,
                                  agg_constant=AGG_CONSTANT)  # fmt: skip
        np.testing.assert_allclose(with_kl - base, 0.3 * kl_agg, rtol=1e-5, atol=1e-6)
        kv, _ = ref.kl_and_grad(batch["logp"], batch["ref"], MASK, est)
        np.testing.assert_allclose(m["kl"], kv[MASK > 0].mean(), rtol=1e-5)
    with_ent, m = losses.policy_loss(*args, algo(entropy_coef=0.1, **kw), entropy_BT=batch["entropy"])
    ent_agg = losses.aggregate(jnp.asarray(batch["entropy"], jnp.float32), MASK, agg, agg_constant=AGG_CONSTANT)
    np.testing.assert_allclose(base - with_ent, 0.1 * ent_agg, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m["entropy"], batch["entropy"][MASK > 0].mean(), rtol=1e-5)


def random_batch(seed, B=8, T=6):
    rng = np.random.RandomState(seed)
    lengths = np.array([6, 1, 4, 0, 5, 2, 6, 3])[:B]
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
    mask[0, 2] = 0  # an env token inside a row
    logp = rng.uniform(-3, -0.1, (B, T)).astype(np.float32)
    old = (logp - rng.uniform(-0.6, 0.6, (B, T))).astype(np.float32)
    return dict(
        logp=logp, old=old, adv=rng.normal(size=B).astype(np.float32), mask=mask,
        ref=(logp - rng.uniform(-1, 1, (B, T))).astype(np.float32),
        entropy=rng.uniform(0.1, 2.0, (B, T)).astype(np.float32),
    )  # fmt: skip


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("mode", losses.LOSS_MODES)
def test_gradient_accumulation_is_exact(mode, agg):
    """4 micro-batches with the full batch's denominators == 1 batch: loss, grads, metrics."""
    b = random_batch(3)
    kw = dict(loss_mode=mode, agg=agg, agg_constant=AGG_CONSTANT, kl_coef=0.1, entropy_coef=0.01,
              **(dict(clip_high=0.28, clip_c=3.0) if mode == "ppo" else dict(clip_low=0.01, clip_high=0.02)))  # fmt: skip

    def step(logp, old, adv, mask, ref_logp, entropy, denominators):
        def f(lp):
            return losses.policy_loss(lp, old, adv, mask, algo(**kw), ref_logp_BT=ref_logp, entropy_BT=entropy,
                                      denominators=denominators)  # fmt: skip

        return jax.value_and_grad(f, has_aux=True)(logp)

    cols = [b[c] for c in ("logp", "old", "adv", "mask", "ref", "entropy")]
    global_d = losses.loss_denominators(b["mask"])
    (full_loss, full_m), full_g = step(*cols, global_d)
    micro = [step(*(x[i : i + 2] for x in cols), global_d) for i in range(0, 8, 2)]
    micro_loss = np.array([float(l) for (l, _), _ in micro])
    micro_g = np.concatenate([np.asarray(g) for _, g in micro])
    micro_m = [m for (_, m), _ in micro]
    local_loss = np.array([
        float(step(*(x[i : i + 2] for x in cols), losses.loss_denominators(b["mask"][i : i + 2]))[0][0])
        for i in range(0, 8, 2)
    ])  # fmt: skip
    np.testing.assert_allclose(micro_loss.sum(), full_loss, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(micro_g).reshape(full_g.shape), full_g, rtol=1e-6, atol=1e-6)
    merged = losses.merge_metrics(micro_m)
    for k in full_m:
        np.testing.assert_allclose(merged[k], full_m[k], rtol=1e-6, atol=1e-6, err_msg=k)
    # Control: local denominators do not add up, so the test can fail.
    assert abs(float(local_loss.sum()) - float(full_loss)) > 1e-3


def test_aggregation_modes_by_hand():
    x = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0], [9.0, 9.0, 9.0]])
    m = jnp.array([[1, 1, 1], [1, 1, 0], [0, 0, 0]])  # last row: padding only
    assert float(losses.aggregate(x, m, "token-mean")) == pytest.approx(15 / 5)
    assert float(losses.aggregate(x, m, "seq-mean-token-mean")) == pytest.approx((2 + 4.5) / 2)
    assert float(losses.aggregate(x, m, "seq-mean-token-sum")) == pytest.approx(15 / 2)
    assert float(losses.aggregate(x, m, "seq-mean-token-sum-norm", agg_constant=3)) == pytest.approx(15 / 2 / 3)
    assert float(losses.aggregate(x, jnp.zeros_like(m), "token-mean")) == 0.0  # empty, not nan


def test_errors():
    x, m = jnp.zeros((2, 3)), jnp.ones((2, 3))
    with pytest.raises(ValueError, match="agg_constant"):
        losses.policy_loss(x, x, jnp.zeros(2), m, algo(agg="seq-mean-token-sum-norm"))
    with pytest.raises(ValueError, match="unknown agg"):
        losses.aggregate(x, m, "mean")
    with pytest.raises(ValueError, match="agg='mean' is not one of"):  # the algorithm refuses it first
        losses.policy_loss(x, x, jnp.zeros(2), m, algo(agg="mean"))
    with pytest.raises(ValueError, match="loss_mode"):
        losses.policy_loss(x, x, jnp.zeros(2), m, algo(loss_mode="grpo"))
    with pytest.raises(ValueError, match="clip_c > 1"):
        losses.policy_loss(x, x, jnp.zeros(2), m, algo(clip_c=0.5))
    with pytest.raises(ValueError, match="ref_logp_BT"):
        losses.policy_loss(x, x, jnp.zeros(2), m, algo(kl_coef=0.1))
    with pytest.raises(ValueError, match="agg_constant must be positive"):
        algo(agg="seq-mean-token-sum-norm", agg_constant=0)
    with pytest.raises(ValueError, match="kl_estimator"):
        losses.kl_penalty(x, x, "k4")


def test_presets_follow_the_reference():
    P = presets.PRESETS
    assert set(P) == {"grpo", "dapo", "gspo", "drgrpo"}
    assert (P["grpo"].agg, P["grpo"].clip_low, P["grpo"].clip_high) == ("seq-mean-token-mean", 0.2, 0.2)
    d = P["dapo"]
    assert (d.agg, d.clip_low, d.clip_high, d.dynamic_sampling, d.max_num_gen_batches) == ("token-mean", 0.2, 0.28,
                                                                                           True, 10)  # fmt: skip
    assert d.overlong_buffer and d.kl_coef == 0
    g = P["gspo"]
    assert (g.loss_mode, g.agg, g.clip_low, g.clip_high, g.clip_c) == ("gspo", "seq-mean-token-mean", 3e-4, 4e-4, None)
    r = P["drgrpo"]
    assert (r.estimator, r.agg, r.norm_std) == ("drgrpo", "seq-mean-token-sum-norm", False)
    assert all(c.entropy_coef == 0 and c.norm_std == (n != "drgrpo") for n, c in P.items())
    assert presets.preset("grpo", kl_coef=0.001).kl_coef == 0.001 and P["grpo"].kl_coef == 0
    with pytest.raises(ValueError, match="unknown algorithm preset"):
        presets.preset("ppo2")
    with pytest.raises(ValueError, match="unknown AlgorithmConfig fields"):
        presets.preset("grpo", clip=0.3)
    with pytest.raises(ValueError, match="clip_c"):
        presets.preset("gspo", clip_c=3.0)


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_presets_drive_a_jitted_loss(name):
    cfg = presets.preset(name, agg_constant=6)
    b = random_batch(5)
    f = jax.jit(functools.partial(losses.policy_loss, algo=cfg))
    loss, metrics = f(b["logp"], b["old"], b["adv"], b["mask"])
    eager, _ = losses.policy_loss(b["logp"], b["old"], b["adv"], b["mask"], cfg)
    assert np.isfinite(float(loss)) and float(loss) == pytest.approx(float(eager), rel=1e-6)
    assert advantages(np.array([1.0, 0.0]), np.array([0, 0]), cfg).shape == (2,)
