"""The policy update of a step (`train.update.train_on`): its optimizer steps and its metrics."""

import numpy as np
import pytest
from ml_collections import ConfigDict

from jaxscaffold.rl.presets import preset
from jaxscaffold.rollout.conversation import Conversation
from jaxscaffold.train.job import Job
from jaxscaffold.episodes.episode import Episode
from jaxscaffold.train.update import train_on


def _episode(group, reward, n_tokens=3):
    conv = Conversation()
    conv.add_context([1, 2, 3])
    conv.ids += [7] * n_tokens
    conv.assistant_mask += [1] * n_tokens
    conv.logprobs += [0.0] * n_tokens
    return Episode(task=None, group=group, conversation=conv, reward=reward)


def _job(ppo_epochs, num_minibatches, train_step):
    cfg = ConfigDict({"rl": {"ppo_epochs": ppo_epochs, "num_minibatches": num_minibatches, "minibatch_rows": 0,
                             "recompute_old_logprobs": False, "tis_cap": 0.0, "group_stats": "trajectory",
                             "mis": "off", "mis_lo": 0.5, "mis_hi": 2.0, "mis_denominator": "all"},
                      "rollout": {"max_new_tokens": 8}})
    return Job(cfg, mesh=None, model_config=None, tokenizer=None, sampler=None, eval_sampler=None,
               train_step=train_step, algo=preset("grpo"), row_multiple=1)


@pytest.mark.parametrize("epochs, minibatches", [(1, 2), (2, 1), (2, 3)])
def test_train_metrics_are_the_mean_over_the_optimizer_steps(epochs, minibatches):
    """With several mini-batches (or epochs) the reported `train/` metrics are the mean of every
    optimizer step's metrics, not the last step's."""
    seen = []

    def train_step(state, batch, frozen):
        assert frozen is None  # full fine-tuning without a KL reference: nothing frozen
        seen.append(int(batch["tokens_BT"].shape[0]))
        k = len(seen)
        return state + 1, {"loss": np.float32(k), "grad_norm": np.float32(10 * k * k)}

    episodes = [_episode(g, r) for g in range(2) for r in (0.0, 1.0, 1.0)]
    state, metrics = train_on(_job(epochs, minibatches, train_step), 0, episodes)
    steps = epochs * minibatches
    assert state == steps and len(seen) == steps
    assert metrics["train/loss"] == pytest.approx(np.mean(np.arange(1, steps + 1)))
    assert metrics["train/grad_norm"] == pytest.approx(np.mean(10 * np.arange(1, steps + 1) ** 2))
    assert sum(seen[:minibatches]) == len(episodes)  # each epoch's mini-batches cover every row once


def test_minibatches_by_rows_count_the_global_batch():
    """rl.minibatch_rows: as many optimizer steps as verl's split of the global batch into that
    many rows (ceil), this process's rows in order in near-equal parts; none without rows."""
    from jaxscaffold.train.update import minibatches
    parts = minibatches(300, 1, 128)
    assert [len(p) for p in parts] == [100, 100, 100]
    np.testing.assert_array_equal(np.concatenate(parts), np.arange(300))
    assert len(minibatches(256, 1, 128)) == 2 and len(minibatches(257, 1, 128)) == 3
    assert [len(p) for p in minibatches(40, 1, 128, global_rows=300)] == [14, 13, 13]  # one of several processes
    assert [len(p) for p in minibatches(7, 3)] == [3, 2, 2]
    assert minibatches(0, 3) == [] and minibatches(0, 1, 128) == []


def _real_job(recompute, minibatch_rows, tis_cap=0.0, lr=0.0):
    import optax
    from jaxscaffold.rl.train_step import make_train_step
    from tests.rl.test_train_step import CONFIG
    cfg = ConfigDict({"rl": {"ppo_epochs": 1, "num_minibatches": 1, "minibatch_rows": minibatch_rows,
                             "recompute_old_logprobs": recompute, "tis_cap": tis_cap, "micro_batches": 1,
                             "group_stats": "trajectory", "mis": "off", "mis_lo": 0.5, "mis_hi": 2.0, "mis_denominator": "all"},
                      "rollout": {"max_new_tokens": 8}})
    from jaxscaffold.rl.losses import Correction
    algo = preset("grpo", correction=Correction(tis_cap=tis_cap))  # the run's algorithm: its TIS cap too
    step = make_train_step(CONFIG, algo, optax.sgd(lr))  # lr 0: every step sees the initial policy
    return Job(cfg, mesh=None, model_config=CONFIG, tokenizer=None, sampler=None, eval_sampler=None,
               train_step=step, algo=algo, row_multiple=1)


def _sampled_episodes(params, delta_scale=0.2):
    """Episodes whose sampler log-probs are the trainer's minus a hand-made offset `delta`."""
    import jax.numpy as jnp
    from jaxscaffold.rl.logprobs import token_logprobs
    from tests.rl.test_train_step import CONFIG
    rng = np.random.RandomState(0)
    episodes, deltas = [], []
    for g in range(2):
        for r in range(3):
            conv = Conversation()
            conv.add_context(list(rng.randint(0, CONFIG.vocab_size, 3)))
            n = 2 + r
            conv.ids += list(rng.randint(0, CONFIG.vocab_size, n))
            conv.assistant_mask += [1] * n
            logp = np.asarray(token_logprobs(params, CONFIG, jnp.asarray([conv.ids], jnp.int32))[0])[0]
            delta = rng.randn(n) * delta_scale
            conv.logprobs += list(logp[-n:] - delta)
            deltas.append(delta)
            episodes.append(Episode(task=None, group=g, conversation=conv, reward=float(r == 1)))
    return episodes, np.concatenate(deltas)


@pytest.mark.parametrize("recompute, minibatch_rows", [(True, 4), (False, 0)])
def test_train_on_logs_the_sampler_trainer_mismatch(recompute, minibatch_rows):
    """train/mismatch_* are NumPy's KL and ratios of the hand-made offset over every trained
    token: with the trainer's recompute over both mini-batches (4 rows of 6 -> 2 steps), or from
    the first step of a single mini-batch."""
    import jax
    from jaxscaffold.rl.train_step import init_train_state
    from tests.rl.test_train_step import _params
    import optax
    params = _params()
    episodes, delta = _sampled_episodes(params)
    job = _real_job(recompute, minibatch_rows)
    state = init_train_state(jax.tree.map(lambda x: x.copy(), params), optax.sgd(0.0))
    state, metrics = train_on(job, state, episodes)
    assert int(state.step) == (2 if minibatch_rows else 1)
    np.testing.assert_allclose(metrics["train/mismatch_kl"], np.mean(np.expm1(delta) - delta), rtol=5e-4)
    np.testing.assert_allclose(metrics["train/mismatch_ratio_max"], np.exp(delta).max(), rtol=5e-4)
    np.testing.assert_allclose(metrics["train/mismatch_ratio_min"], np.exp(delta).min(), rtol=5e-4)
    if recompute:  # the PPO ratio is against the trainer's own old log-probs now
        assert abs(metrics["train/ratio_max"] - 1) < 1e-4
    else:
        np.testing.assert_allclose(metrics["train/ratio_max"], np.exp(delta).max(), rtol=5e-4)


def test_later_mini_batches_train_off_policy_and_the_mismatch_is_measured_before():
    """Several optimizer steps per rollout batch (the reference's mini-batches): the first step
    is on the trainer's own old log-probs (ratio 1), the second after an update (ratio != 1, so
    the clips can bind), and the logged mismatch is still the one before any update."""
    import jax
    import optax
    from jaxscaffold.rl.train_step import init_train_state
    from tests.rl.test_train_step import _params
    params = _params()
    episodes, delta = _sampled_episodes(params)
    job = _real_job(True, 3, lr=1.0)
    seen = []
    step = job.train_step

    def recording(state, batch, frozen=None):
        state, m = step(state, batch, frozen)
        seen.append(float(m["ratio_max"]))
        return state, m

    job.train_step = recording
    state = init_train_state(jax.tree.map(lambda x: x.copy(), params), optax.sgd(1.0))
    _, metrics = train_on(job, state, episodes)
    assert len(seen) == 2 and abs(seen[0] - 1) < 1e-4 and seen[1] > 1 + 1e-3
    np.testing.assert_allclose(metrics["train/mismatch_kl"], np.mean(np.expm1(delta) - delta), rtol=5e-4)
