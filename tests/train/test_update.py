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
                             "recompute_old_logprobs": False, "tis_cap": 0.0},
                      "rollout": {"max_new_tokens": 8}})
    return Job(cfg, mesh=None, model_config=None, tokenizer=None, sampler=None, eval_sampler=None,
               train_step=train_step, algo=preset("grpo"), row_multiple=1)


@pytest.mark.parametrize("epochs, minibatches", [(1, 2), (2, 1), (2, 3)])
def test_train_metrics_are_the_mean_over_the_optimizer_steps(epochs, minibatches):
    """With several mini-batches (or epochs) the reported `train/` metrics are the mean of every
    optimizer step's metrics, not the last step's."""
    seen = []

    def train_step(state, batch):
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
