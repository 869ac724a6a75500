"""A test environment whose steps take time: the rollout benchmark's env (`launch/bench.py rollout`).

Each step sleeps for a log-normal time with a given median and 99th percentile (an env
server, a simulator, a user model), and an episode ends after a number of turns drawn
uniformly from [min_turns, max_turns]. Every draw is seeded by the task's seed and the
agent's action text, so a run is reproducible, the rollouts of one group (same task,
different actions) differ, and the same actions give the same sleeps in any schedule
(lock-step or asynchronous) and in any worker process. `draws` recomputes them from an
episode's recorded actions (the benchmark's bound uses it).

The reward is the letters task's (`letters.letter_share` of the last action), so a training
step on it has a signal.
"""

from __future__ import annotations

import math
import random
import time
import zlib
from typing import Sequence

from jaxscaffold.envs.base import EnvSpec, Observation, StepResult, Task
from jaxscaffold.envs.letters import letter_share

Z_99 = 2.3263478740408408  # the standard normal's 99th percentile
SPLITS = ("train", "test")
SPEC = EnvSpec("latency", __name__, "LatencyEnv", splits=SPLITS)  # steps that sleep: the rollout benchmark's
SYSTEM_PROMPT = "You are a writer. Answer with text only."


def catalogue(split: str, n: int = 64) -> list[Task]:
    """`n` tasks per split; train and test have disjoint seeds."""
    if split not in SPLITS:
        raise ValueError(f"latency has no split {split!r}; splits: {', '.join(SPLITS)}")
    offset = SPLITS.index(split) * 1_000_000
    return [Task("latency", f"{split}-{i}", split, seed=offset + i) for i in range(n)]


def lognormal_sigma(median_s: float, p99_s: float) -> float:
    """The log-space standard deviation of a log-normal with this median and 99th percentile."""
    if median_s <= 0:
        return 0.0
    if p99_s < median_s:
        raise ValueError(f"the p99 latency {p99_s} s is below the median {median_s} s")
    return math.log(p99_s / median_s) / Z_99


def _rng(seed: int, *parts: object) -> random.Random:
    # crc32 of the text, not hash(): stable across processes (PYTHONHASHSEED)
    return random.Random(zlib.crc32(repr((seed, *parts)).encode()))


def episode_turns(seed: int, first_action: str, min_turns: int, max_turns: int) -> int:
    """The episode's length, drawn at its first step."""
    return _rng(seed, "turns", first_action).randint(min_turns, max_turns)


def step_latency_s(seed: int, turn: int, action: str, median_s: float, p99_s: float) -> float:
    """The sleep of step `turn` (0-based) after `action`."""
    if median_s <= 0:
        return 0.0
    z = _rng(seed, "latency", turn, action).gauss(0.0, 1.0)
    return median_s * math.exp(lognormal_sigma(median_s, p99_s) * z)


def draws(seed: int, actions: Sequence[str], *, median_ms: float, p99_ms: float, min_turns: int,
          max_turns: int) -> tuple[int, list[float]]:
    """(the episode's drawn length, each step's sleep in seconds) for the actions an episode
    took (`Episode.actions`: what `LatencyEnv.step` read)."""
    if not actions:
        return 0, []
    turns = episode_turns(seed, actions[0], min_turns, max_turns)
    return turns, [step_latency_s(seed, t, a, median_ms / 1e3, p99_ms / 1e3) for t, a in enumerate(actions)]


class LatencyEnv:
    """Steps sleep log-normal(median_ms, p99_ms); episodes last U[min_turns, max_turns] turns.
    `reset_ms`: a fixed sleep at reset (0: none)."""

    name = "latency"

    def __init__(self, median_ms: float = 200.0, p99_ms: float = 2000.0, min_turns: int = 2, max_turns: int = 14,
                 reset_ms: float = 0.0, letter: str = "e"):
        if not 1 <= min_turns <= max_turns:
            raise ValueError(f"latency env: need 1 <= min_turns <= max_turns, got {min_turns}-{max_turns}")
        if median_ms < 0 or reset_ms < 0:
            raise ValueError("latency env: latencies must be >= 0 ms")
        lognormal_sigma(median_ms, p99_ms)  # checks p99 >= median
        self.median_s, self.p99_s, self.reset_s = median_ms / 1e3, p99_ms / 1e3, reset_ms / 1e3
        self.min_turns, self.max_turns, self.letter = min_turns, max_turns, letter
        self._task: Task | None = None
        self._turn, self._turns = 0, 0

    def reset(self, task: Task) -> Observation:
        time.sleep(self.reset_s)
        self._task, self._turn, self._turns = task, 0, 0
        return Observation(f"Turn 1. Write text that uses the letter '{self.letter}' as often as possible.",
                           system_prompt=SYSTEM_PROMPT)

    def step(self, action_text: str) -> StepResult:
        if self._task is None:
            raise RuntimeError("step() before reset()")
        action = action_text.strip()
        seed = self._task.seed
        if self._turn == 0:
            self._turns = episode_turns(seed, action, self.min_turns, self.max_turns)
        slept = step_latency_s(seed, self._turn, action, self.median_s, self.p99_s)
        time.sleep(slept)
        self._turn += 1
        done = self._turn >= self._turns
        share = letter_share(action[:10_000], self.letter)
        text = "Episode over." if done else f"Turn {self._turn + 1} of the latency test. Write again."
        return StepResult(Observation(text), reward=share if done else 0.0, done=done,
                          info={"won": done and share >= 0.5, "score": share, "latency_s": slept}, action=action)

    def close(self) -> None:
        pass
