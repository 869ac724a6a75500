"""rollout.max_rows_in_flight: a step's groups sampled in waves of whole groups give the
episodes (tokens, rewards, feedback) and the training of one pass, with a smaller sampler."""

import numpy as np
import pytest

from jaxscaffold.train.trainer import train
from jaxscaffold.train.waves import groups_per_wave, waves
from jaxscaffold.train.workloads.env_rl import EnvWorkload
from tests.train.configs import tiny_config


class _Rollout:
    def __init__(self, rows, group_size=4):
        self.max_rows_in_flight, self.group_size = rows, group_size


@pytest.mark.parametrize("rows, groups, per_wave", [(0, 5, 5), (4, 5, 1), (9, 5, 2), (100, 5, 5), (8, 0, 1)])
def test_groups_per_wave_holds_whole_groups(rows, groups, per_wave):
    assert groups_per_wave(_Rollout(rows), groups) == per_wave
    assert waves(range(5), 2) == [[0, 1], [2, 3], [4]]


def _run(tmp_path, rows):
    collected, sizes = {}, set()

    class Recording(EnvWorkload):
        def collect(self, job, params, step):
            sizes.add(job.sampler.batch_size)
            episodes, stats = super().collect(job, params, step)
            collected[step] = [(e.group, e.conversation.ids, e.conversation.logprobs, e.reward, e.actions, e.feedback)
                               for e in episodes]
            return episodes, stats

    cfg = tiny_config(tmp_path, steps=2, words=True, **{"rollout.tasks_per_step": 3, "rollout.max_rows_in_flight": rows,
                                           "eval.every": 0, "checkpoint.every": 10,
                                           "feedback.schedule": "ag_early_oe_late", "feedback.probability": 0.5})
    hist = train(cfg, workload=Recording)["history"]
    return collected, sizes, [h["train/loss"] for h in hist]


@pytest.mark.slow
@pytest.mark.default_emitters  # a row samples bitwise alike at any batch size (tests/rollout/test_batch_invariance.py)
def test_waves_sample_and_train_as_one_pass(tmp_path):
    one, one_sizes, one_loss = _run(tmp_path / "one", 0)
    waved, waved_sizes, waved_loss = _run(tmp_path / "waves", 8)  # 2 groups of 4, then 1
    assert one_sizes == {12} and waved_sizes == {8}
    assert waved == one and len(one[1]) == 12
    np.testing.assert_array_equal(waved_loss, one_loss)
