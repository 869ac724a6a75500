"""A small learnable task with real text: write using one letter as much as possible.

The prompt names a letter; the reward is the share of the response's letters that are that
letter (0 when it has none). A random policy scores about the letter's frequency among its
tokens' characters, a trained one close to 1, so a tiny random model's reward visibly rises
within minutes on CPU: the embedded default uses it to show learning end to end.
"""

from __future__ import annotations

import random
import string
import unicodedata

from jaxscaffold.envs.base import EnvSpec, Observation, StepResult, Task

SPEC = EnvSpec("letters", __name__, "LettersEnv", splits=("train", "test"))

LETTERS = "e"


def catalogue(split: str, n: int = 64) -> list[Task]:
    """`n` tasks per split; train and test draw letters from disjoint seeds."""
    rng = random.Random({"train": 0, "test": 1}.get(split, 2))
    return [Task("letters", f"{split}-{i}", split, seed=i, spec={"letter": rng.choice(LETTERS)}) for i in range(n)]


def letter_share(text: str, letter: str) -> float:
    letters = [c for c in unicodedata.normalize("NFKC", text).lower() if c in string.ascii_lowercase]
    return sum(c == letter for c in letters) / len(letters) if letters else 0.0


class LettersEnv:
    """One-step episodes; `success` is a share above `win_share`."""

    name = "letters"

    def __init__(self, win_share: float = 0.5):
        self.win_share = win_share
        self._letter = None

    def reset(self, task: Task) -> Observation:
        self._letter = task.spec["letter"]
        return Observation(f"Write text that uses the letter '{self._letter}' as often as possible.",
                           privileged={"letter": self._letter})

    def step(self, action_text: str) -> StepResult:
        if self._letter is None:
            raise RuntimeError("step() before reset()")
        share = letter_share(action_text[:10_000], self._letter)
        return StepResult(Observation("Episode over."), reward=share, done=True,
                          info={"won": share >= self.win_share, "score": share})

    def close(self) -> None:
        pass
