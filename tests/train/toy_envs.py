"""A toy multi-step environment with feedback enrichers, for loop tests that need feedback
(letters has no enrichers) or groups of mixed binary success (a random tiny model rarely wins
letters). Registered in-process only (`envs.num_workers = 0`) with `register(monkeypatch)`."""

from __future__ import annotations

import zlib

from jaxscaffold.envs import prompts, registry
from jaxscaffold.envs.base import Observation, StepResult, Task
from jaxscaffold.feedback import enrichers

NAME = "coin"


def catalogue(split: str, n: int = 16) -> list[Task]:
    return [Task(NAME, f"{split}-{i}", split, seed=i) for i in range(n)]


class CoinEnv:
    """Up to 3 steps; the text of each action decides (by its CRC) whether the episode ends
    there and its final reward in {0, 0.1, ..., 0.9} (won at 0.8 or more), so a random policy
    gives groups of mixed success and episodes of different lengths, and even a constant text
    most likely a non-zero reward."""

    name = NAME

    def reset(self, task: Task) -> Observation:
        self.steps = 0
        return Observation(f"Task {task.task_id}: say something.")

    def step(self, action_text: str) -> StepResult:
        self.steps += 1
        h = zlib.crc32(action_text.encode())
        done = self.steps >= 3 or h % 3 == 0
        reward = (h // 3 % 10) / 10 if done else 0.0
        return StepResult(Observation(f"Step {self.steps}: go on."), reward=reward, done=done,
                          info={"won": reward >= 0.8})

    def close(self) -> None:
        pass


def register(monkeypatch=None) -> None:
    """Makes `coin` a known environment with an AG and an OE enricher: test-scoped through
    pytest's `monkeypatch`, or for the whole process (a worker subprocess) without it."""
    setitem = monkeypatch.setitem if monkeypatch is not None else (lambda d, k, v: d.__setitem__(k, v))
    setitem(registry.ENVS, NAME, registry.EnvSpec(NAME, __name__, "CoinEnv"))
    setitem(prompts.SYSTEM_PROMPTS, NAME, "You are a player. Answer with text only.")
    setitem(enrichers.FEEDBACK, NAME, enrichers.FeedbackSpec(forms={
        "ag": {"paper": lambda obs, actions: obs.text + "\n[AG] say hi"},
        "oe": {"checklist": lambda obs, actions: obs.text + "\n[OE] 1/3"}}))
