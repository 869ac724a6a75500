"""The SFT step (WM-SFT baseline, the difficulty filter's predictor): the loss is the masked
token cross-entropy of an independent full-forward log-softmax, micro-batching does not change
the update, and repeated steps fit the targets."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxscaffold.models import qwen3
from jaxscaffold.rl.train_step import init_train_state, make_sft_step
from tests.rl.test_train_step import CONFIG, _batch, _params


def _reference_nll(params, batch):
    tokens, seg, mask = (jnp.asarray(batch[k]) for k in ("tokens_BT", "segment_ids_BT", "loss_mask_BT"))
    logp = jax.nn.log_softmax(qwen3.forward(params, CONFIG, tokens, segment_ids_BT=seg), -1)
    tgt = jnp.take_along_axis(logp[:, :-1], tokens[:, 1:, None], -1)[..., 0]  # predicts token t+1
    m = mask[:, 1:].astype(jnp.float32)
    return float(-jnp.sum(tgt * m) / jnp.sum(m))


def test_loss_is_masked_cross_entropy_and_micro_batches_agree():
    opt = optax.sgd(0.1)  # plain SGD: the update is the gradient (Adam's first step is ~sign(g))
    batch = _batch(seed=1)
    ref = _reference_nll(_params(), batch)
    results = []
    for n in (1, 4):
        step = make_sft_step(CONFIG, opt, num_micro_batches=n)
        params = jax.tree.map(jnp.copy, _params())  # the step donates its state
        state, m = step(init_train_state(params, opt), batch)
        np.testing.assert_allclose(float(m["nll"]), ref, rtol=1e-5)
        results.append(state.params)
    # Same update up to f32 summation order (the policy step's accumulation test: ~3e-5 relative).
    for a, b, p0 in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1]), jax.tree.leaves(_params())):
        ua, ub = np.asarray(a) - np.asarray(p0), np.asarray(b) - np.asarray(p0)
        np.testing.assert_allclose(ua, ub, atol=1e-3 * np.abs(ua).max())


def test_repeated_steps_fit_the_targets():
    opt = optax.adam(3e-3)
    step = make_sft_step(CONFIG, opt)
    batch = _batch(seed=2)
    state = init_train_state(jax.tree.map(jnp.copy, _params()), opt)
    losses = []
    for _ in range(30):
        state, m = step(state, batch)
        losses.append(float(m["nll"]))
    assert losses[-1] < 0.3 * losses[0], losses
