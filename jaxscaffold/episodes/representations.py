"""How the model's turns become token rows: two strategies of one interface.

- `Trajectory`: one growing token sequence per episode (env tokens masked, the KV cache
  reused); each observation is appended as a user turn.
- `StepWise`: the reference code's rows, one per model turn: a prompt rebuilt each step from
  the task, the last `history_window` (observation, action) pairs and the current observation.
"""

from __future__ import annotations

from typing import Protocol

from jaxscaffold.envs.prompts import history_window_text
from jaxscaffold.episodes.episode import Episode
from jaxscaffold.models.chat import Qwen3ChatRenderer
from jaxscaffold.rollout.conversation import Conversation, MultiTurn


class Representation(Protocol):
    def next_prompt(self, mt: MultiTurn, slot: int, episode: Episode, system: str, shown: str,
                    stopped: bool) -> tuple[list[int], int]:
        """The ids that carry `shown` to the model in `slot` (`stopped`: the last turn ended on
        its stop token), and the room they must fit in with the next turn."""

    def close_turns(self, mt: MultiTurn, slots: list[int]) -> dict[int, Conversation]:
        """Rows the turn just taken completes (their slots are freed), before the next prompts."""

    def final_rows(self, conversation: Conversation) -> list[Conversation]:
        """Rows the episode's last conversation adds to `Episode.rows`."""


class Trajectory:
    def __init__(self, chat: Qwen3ChatRenderer, enable_thinking: bool, im_end: int):
        self.chat, self.enable_thinking, self.im_end = chat, enable_thinking, im_end

    def next_prompt(self, mt, slot, episode, system, shown, stopped):
        ids = self.chat.continue_with_user(shown, enable_thinking=self.enable_thinking)
        if not stopped:
            ids = [self.im_end] + ids  # close a turn cut off by max_new_tokens
        return ids, mt.room(slot)

    def close_turns(self, mt, slots):
        return {}

    def final_rows(self, conversation):
        return []


class StepWise:
    def __init__(self, chat: Qwen3ChatRenderer, enable_thinking: bool, history_window: int):
        self.chat, self.enable_thinking, self.history_window = chat, enable_thinking, history_window

    def next_prompt(self, mt, slot, episode, system, shown, stopped):
        ep = episode
        window = list(zip(ep.observations[:-1], ep.actions))[-self.history_window:] if self.history_window else []
        user = history_window_text(ep.observations[0], window, shown, ep.steps)
        ids = self.chat.render([{"role": "system", "content": system}, {"role": "user", "content": user}],
                               add_generation_prompt=True, enable_thinking=self.enable_thinking)
        return ids, mt.sampler.max_len - 1

    def close_turns(self, mt, slots):
        return mt.release(slots) if slots else {}

    def final_rows(self, conversation):
        return [conversation]


NAMES = ("trajectory", "stepwise")


def make(name: str, chat: Qwen3ChatRenderer, *, enable_thinking: bool, history_window: int,
         im_end: int) -> Representation:
    """The representation called `name` (one of NAMES)."""
    if name == "trajectory":
        return Trajectory(chat, enable_thinking, im_end)
    if name == "stepwise":
        return StepWise(chat, enable_thinking, history_window)
    raise ValueError(f"unknown representation {name!r} (trajectory, stepwise)")
