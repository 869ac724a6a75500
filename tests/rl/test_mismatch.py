"""The sampler/trainer mismatch, the trainer's recomputed old log-probs and TIS, against
independent computations (a full log-softmax forward pass and NumPy)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxscaffold.rl import logprobs as lp_lib
from jaxscaffold.rl import mismatch
from jaxscaffold.rl.losses import policy_loss
from jaxscaffold.rl.presets import AlgorithmConfig, preset
from jaxscaffold.rl.train_step import init_train_state, make_old_logprob_step, make_train_step
from tests.rl import numpy_reference as ref
from tests.rl.test_train_step import CONFIG, _batch, _params


def _trainer_logp(params, batch):
    """The trainer's log-probs of every position: the plain (unmasked) chunked forward pass."""
    logp, _ = lp_lib.token_logprobs(params, CONFIG, jnp.asarray(batch["tokens_BT"]),
                                    segment_ids_BT=jnp.asarray(batch["segment_ids_BT"]))
    return np.asarray(logp)


def _offset_batch(seed, delta_scale=0.2):
    """A batch whose sampler log-probs are the trainer's minus a hand-made offset `delta`
    (so pi_trainer / pi_sampler = exp(delta) on the trained tokens)."""
    params, batch = _params(), _batch(seed)
    mask = batch["loss_mask_BT"]
    delta = np.random.RandomState(seed + 100).randn(*mask.shape).astype(np.float32) * delta_scale
    batch["old_logp_BT"] = ((_trainer_logp(params, batch) - delta) * mask).astype(np.float32)
    return params, batch, delta


def _numpy_mismatch(delta, mask):
    d = delta[mask > 0].astype(np.float64)
    return {"mismatch_kl": np.mean(np.expm1(d) - d), "mismatch_ratio_max": np.exp(d).max(),
            "mismatch_ratio_min": np.exp(d).min()}


@pytest.mark.parametrize("micro", [1, 2])
def test_recompute_with_an_exact_sampler_measures_no_mismatch(micro):
    """old_logp = the trainer's own log-probs (computed independently): KL ~ 0, ratios ~ 1, and
    the recomputed old log-probs are those log-probs, row for row (also through micro-batches)."""
    params, batch = _params(), _batch(4)
    mask = batch["loss_mask_BT"]
    exact = (_trainer_logp(params, batch) * mask).astype(np.float32)
    batch["old_logp_BT"] = exact
    out, m = make_old_logprob_step(CONFIG, num_micro_batches=micro)(params, batch)
    assert abs(float(m["mismatch_kl"])) < 1e-7
    assert abs(float(m["mismatch_ratio_max"]) - 1) < 1e-4 and abs(float(m["mismatch_ratio_min"]) - 1) < 1e-4
    assert float(m["tokens"]) == mask.sum()
    np.testing.assert_allclose(np.asarray(out["old_logp_BT"]), exact, rtol=1e-5, atol=1e-5)  # f32 rounding
    assert "tis_weight_BT" not in out
    for k in ("tokens_BT", "segment_ids_BT", "loss_mask_BT", "adv_B"):
        np.testing.assert_array_equal(np.asarray(out[k]), batch[k])


def test_a_hand_made_sampler_offset_gives_the_numpy_kl_and_tis_weights():
    params, batch, delta = _offset_batch(5)
    mask = batch["loss_mask_BT"]
    cap = 1.1  # binds on some tokens (exp(delta) up to ~1.8), not on others
    out, m = make_old_logprob_step(CONFIG, tis_cap=cap, num_micro_batches=2)(params, batch)
    want = _numpy_mismatch(delta, mask)
    for k, v in want.items():
        np.testing.assert_allclose(float(m[k]), v, rtol=2e-4, err_msg=k)
    w_np = np.where(mask > 0, np.minimum(np.exp(delta.astype(np.float64)), cap), 0.0)
    assert 0 < (w_np[mask > 0] == cap).mean() < 1
    np.testing.assert_allclose(np.asarray(out["tis_weight_BT"]), w_np, rtol=2e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(mismatch.tis_weights(_trainer_logp(params, batch), batch["old_logp_BT"],
                                                               mask, cap)), w_np, rtol=2e-4, atol=1e-6)
    with pytest.raises(ValueError, match="cap > 0"):
        mismatch.tis_weights(batch["old_logp_BT"], batch["old_logp_BT"], mask, 0.0)


def test_train_step_measures_the_mismatch_before_its_update():
    """Without a recompute the step's first measurement (current policy = the sampled one) is
    the mismatch: the NumPy KL of the offset, the same through micro-batches."""
    params, batch, delta = _offset_batch(6)
    want = _numpy_mismatch(delta, batch["loss_mask_BT"])
    sgd = optax.sgd(0.0)
    for micro in (1, 2):
        step = make_train_step(CONFIG, preset("grpo"), sgd, num_micro_batches=micro)
        _, m = step(init_train_state(jax.tree.map(jnp.copy, params), sgd), batch)
        for k, v in want.items():
            np.testing.assert_allclose(float(m[k]), v, rtol=2e-4, err_msg=f"{k}, {micro} micro-batches")


def test_tis_weights_scale_each_tokens_surrogate():
    """policy_loss with TIS weights: NumPy's per-token PPO loss times the weights, aggregated;
    the gradient likewise (the weights are constants)."""
    rng = np.random.RandomState(7)
    b, t = 4, 6
    mask = (rng.rand(b, t) < 0.8).astype(np.int32)
    logp = rng.randn(b, t) * 0.3 - 1.0
    old = logp + rng.randn(b, t) * 0.2
    adv = rng.randn(b)
    w = np.minimum(np.exp(rng.randn(b, t) * 0.3), 1.2)
    for agg in ("token-mean", "seq-mean-token-mean"):
        tok, _, tok_grad = ref.token_loss_and_grad(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, clip_c=3.0)
        weights = ref.agg_weights(mask, agg)
        want = np.sum(weights * w * tok)

        def loss(x):
            return policy_loss(x, jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask),
                               AlgorithmConfig("test", clip_low=0.2, clip_high=0.28, clip_c=3.0, agg=agg),
                               tis_weight_BT=jnp.asarray(w))
        with jax.enable_x64(True):
            value, metrics = loss(jnp.asarray(logp))
            grad = jax.grad(lambda x: loss(x)[0])(jnp.asarray(logp))
        np.testing.assert_allclose(float(value), want, rtol=1e-10, err_msg=agg)
        np.testing.assert_allclose(np.asarray(grad), weights * w * tok_grad, rtol=1e-8, atol=1e-12, err_msg=agg)
        np.testing.assert_allclose(float(metrics["tis_weight_mean"]), w[mask > 0].mean(), rtol=1e-10)


def test_train_step_trains_on_the_recomputed_batch_with_tis():
    """The recompute's batch feeds the train step: its ratio is ~1 against the trainer's old
    log-probs (the sampler offset no longer enters the ratio) and its TIS weights are applied."""
    params, batch, delta = _offset_batch(8)
    mask = batch["loss_mask_BT"]
    out, _ = make_old_logprob_step(CONFIG, tis_cap=1.1)(params, batch)
    sgd = optax.sgd(0.0)
    step = make_train_step(CONFIG, preset("grpo"), sgd)
    _, m = step(init_train_state(jax.tree.map(jnp.copy, params), sgd), out)
    assert abs(float(m["ratio_max"]) - 1) < 1e-4 and abs(float(m["mismatch_kl"])) < 1e-7
    np.testing.assert_allclose(float(m["tis_weight_mean"]), np.minimum(np.exp(delta), 1.1)[mask > 0].mean(), rtol=2e-4)


def test_recompute_runs_sharded_and_feeds_the_sharded_step():
    """On an fsdp x tensor mesh of the 8 test devices: the single-device values, and the
    returned batch (TIS weights included) is laid out as the sharded train step takes it."""
    from jaxscaffold.models.sharding import MeshConfig, make_mesh, shard_batch
    from jaxscaffold.rl.train_step import state_shardings
    mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))
    params, batch, _ = _offset_batch(9)
    want_batch, want = make_old_logprob_step(CONFIG, tis_cap=1.1)(params, batch)
    sgd = optax.sgd(0.0)
    state = jax.device_put(init_train_state(params, sgd), state_shardings(CONFIG, sgd, mesh))
    out, m = make_old_logprob_step(CONFIG, tis_cap=1.1, mesh=mesh)(state.params, shard_batch(batch, mesh))
    for k, v in want.items():
        np.testing.assert_allclose(float(m[k]), float(v), rtol=1e-4, err_msg=k)
    for k in ("old_logp_BT", "tis_weight_BT"):
        np.testing.assert_allclose(np.asarray(out[k]), np.asarray(want_batch[k]), rtol=1e-4, atol=1e-5, err_msg=k)
    _, sm = make_train_step(CONFIG, preset("grpo"), sgd, mesh=mesh)(state, out)
    assert abs(float(sm["ratio_max"]) - 1) < 1e-4 and np.isfinite(float(sm["tis_weight_mean"]))
