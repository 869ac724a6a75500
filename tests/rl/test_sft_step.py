"""The SFT step (WM-SFT baseline, the difficulty filter's predictor): the loss is the masked
token cross-entropy of an independent full-forward log-softmax, one SGD step is its gradient
for each architecture (Qwen3; Qwen2.5, "qwen2": q/k/v biases, no q/k norms), micro-batching
does not change the update, and repeated steps fit the targets."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

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


def _nll(params, config, tokens, seg, mask):
    logp = jax.nn.log_softmax(qwen3.forward(params, config, tokens, segment_ids_BT=seg), -1)
    tgt = jnp.take_along_axis(logp[:, :-1], tokens[:, 1:, None], -1)[..., 0]
    m = mask[:, 1:].astype(jnp.float32)
    return -jnp.sum(tgt * m) / jnp.sum(m)


@pytest.mark.parametrize("model_type", ["qwen3", "qwen2"])
def test_one_sgd_step_is_the_reference_gradient(model_type):
    """One SGD step moves every parameter (Qwen2.5's biases included) by -lr times the gradient
    of the masked token cross-entropy of an independent full-forward log-softmax."""
    config = CONFIG.replace(model_type=model_type)
    rng = np.random.RandomState(0)
    tokens = rng.randint(0, config.vocab_size, (4, 10)).astype(np.int32)
    seg = (np.arange(10)[None] < np.array([10, 7, 5, 9])[:, None]).astype(np.int32)
    mask = seg.copy()
    mask[:, :2] = 0
    batch = {"tokens_BT": tokens, "segment_ids_BT": seg, "loss_mask_BT": mask,  # the step's batch layout:
             "old_logp_BT": np.zeros((4, 10), np.float32), "adv_B": np.zeros(4, np.float32)}  # unused by SFT
    p0 = _params(config=config)
    if model_type == "qwen2":
        assert "q_bias" in p0["layers"] and "q_norm" not in p0["layers"]
    ref = jax.grad(_nll)(p0, config, *(jnp.asarray(x) for x in (tokens, seg, mask)))
    opt = optax.sgd(0.1)
    state, m = make_sft_step(config, opt)(init_train_state(jax.tree.map(jnp.copy, p0), opt), batch)
    np.testing.assert_allclose(float(m["nll"]), float(_nll(p0, config, tokens, seg, mask)), rtol=1e-5)
    for path, new, old, g in zip(jax.tree_util.tree_flatten_with_path(p0)[0], jax.tree.leaves(state.params),
                                 jax.tree.leaves(p0), jax.tree.leaves(ref)):
        update, want = np.asarray(new) - np.asarray(old), -0.1 * np.asarray(g)
        rounding = 4 * np.finfo(np.float32).eps * np.abs(np.asarray(old)).max()  # of new - old in f32
        np.testing.assert_allclose(update, want, atol=1e-4 * np.abs(want).max() + rounding, err_msg=str(path[0]))
    if model_type == "qwen2":
        assert np.abs(np.asarray(ref["layers"]["k_bias"])).max() > 0  # the biases do get trained
