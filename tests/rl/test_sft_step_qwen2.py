"""The SFT step trains a Qwen2.5-architecture model (q/k/v biases, no q/k norms): one SGD step
moves every parameter, the biases included, by -lr times the gradient of the masked token
cross-entropy of an independent full-forward log-softmax."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxscaffold.models import qwen3
from jaxscaffold.rl.train_step import init_train_state, make_sft_step
from tests.rl.test_train_step import CONFIG, _params

QWEN2 = CONFIG.replace(model_type="qwen2")


def _nll(params, tokens, seg, mask):
    logp = jax.nn.log_softmax(qwen3.forward(params, QWEN2, tokens, segment_ids_BT=seg), -1)
    tgt = jnp.take_along_axis(logp[:, :-1], tokens[:, 1:, None], -1)[..., 0]
    m = mask[:, 1:].astype(jnp.float32)
    return -jnp.sum(tgt * m) / jnp.sum(m)


def test_one_sgd_step_is_the_reference_gradient():
    rng = np.random.RandomState(0)
    tokens = rng.randint(0, QWEN2.vocab_size, (4, 10)).astype(np.int32)
    seg = (np.arange(10)[None] < np.array([10, 7, 5, 9])[:, None]).astype(np.int32)
    mask = seg.copy()
    mask[:, :2] = 0
    batch = {"tokens_BT": tokens, "segment_ids_BT": seg, "loss_mask_BT": mask,  # the step's batch layout:
             "old_logp_BT": np.zeros((4, 10), np.float32), "adv_B": np.zeros(4, np.float32)}  # unused by SFT
    p0 = _params(config=QWEN2)
    assert "q_bias" in p0["layers"] and "q_norm" not in p0["layers"]
    ref = jax.grad(_nll)(p0, *(jnp.asarray(x) for x in (tokens, seg, mask)))
    opt = optax.sgd(0.1)
    state, m = make_sft_step(QWEN2, opt)(init_train_state(jax.tree.map(jnp.copy, p0), opt), batch)
    np.testing.assert_allclose(float(m["nll"]), float(_nll(p0, tokens, seg, mask)), rtol=1e-5)
    for path, new, old, g in zip(jax.tree_util.tree_flatten_with_path(p0)[0], jax.tree.leaves(state.params),
                                 jax.tree.leaves(p0), jax.tree.leaves(ref)):
        update, want = np.asarray(new) - np.asarray(old), -0.1 * np.asarray(g)
        rounding = 4 * np.finfo(np.float32).eps * np.abs(np.asarray(old)).max()  # of new - old in f32
        np.testing.assert_allclose(update, want, atol=1e-4 * np.abs(want).max() + rounding, err_msg=str(path[0]))
    assert np.abs(np.asarray(ref["layers"]["k_bias"])).max() > 0  # the biases do get trained
