"""Task RL's rollouts (`train.workloads.env_rl`): DAPO's dynamic sampling when no generation
batch yields a group of mixed success."""

import pytest

from jaxscaffold.envs import prompts, registry
from jaxscaffold.envs.base import Observation, StepResult, Task
from jaxscaffold.rl.dapo import DynamicSamplingExhausted
from jaxscaffold.train.trainer import train
from jaxscaffold.train.workloads.env_rl import EnvWorkload
from tests.train.configs import tiny_config

NAME = "dud"


def catalogue(split: str, n: int = 8) -> list[Task]:
    return [Task(NAME, f"{split}-{i}", split, seed=i) for i in range(n)]


class DudEnv:
    """One step, never won: every group is all-fail, so dynamic sampling can never fill."""

    name = NAME

    def reset(self, task: Task) -> Observation:
        return Observation("Say anything.")

    def step(self, action_text: str) -> StepResult:
        return StepResult(Observation("Done."), reward=0.0, done=True, info={"won": False})

    def close(self) -> None:
        pass


def test_dapo_continues_after_its_last_generation_batch_or_raises(tmp_path, monkeypatch):
    """After max_num_gen_batches (10) without a group of mixed success the step trains on the
    groups it has (none here: no optimizer step) and logs rollout/dynamic_sampling_exhausted = 1,
    as the reference does; `rl.dynamic_sampling_exhausted = "raise"` stops the run instead."""
    monkeypatch.setitem(registry.ENVS, NAME, registry.EnvSpec(NAME, __name__, "DudEnv"))
    monkeypatch.setitem(prompts.SYSTEM_PROMPTS, NAME, "Answer with text only.")
    kept = {}

    class Recording(EnvWorkload):
        def collect(self, job, params, step):
            episodes, stats = super().collect(job, params, step)
            kept[step] = episodes
            return episodes, stats

    settings = {"rl.algorithm": "dapo", "envs.train": NAME, "envs.eval": NAME, "eval.every": 0,
                "checkpoint.every": 1, "rollout.max_new_tokens": 4}
    # On the word vocabulary: the dud env fails every text, whatever the tokenizer.
    out = train(tiny_config(tmp_path / "continue", steps=1, words=True, **settings), workload=Recording)
    h = out["history"][0]
    assert h["rollout/dynamic_sampling_exhausted"] == 1.0 and h["rollout/generation_batches"] == 10
    assert h["rollout/trained_groups"] == 0 and kept[1] == []
    assert h["rollout/dropped_groups"] == 10 * 2  # 2 tasks per step, all-fail, in each batch
    assert int(out["state"].step) == 0 and "train/loss" not in h  # nothing to train on: no optimizer step
    with pytest.raises(DynamicSamplingExhausted, match="10 generation batches"):
        train(tiny_config(tmp_path / "raise", steps=1, words=True, **settings, **{"rl.dynamic_sampling_exhausted": "raise"}))
