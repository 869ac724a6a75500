"""The record of one episode, as the driver fills it and training / metrics read it."""

from __future__ import annotations

import dataclasses

from jaxscaffold.envs.base import Task
from jaxscaffold.rollout.conversation import Conversation


@dataclasses.dataclass
class Episode:
    task: Task
    group: int
    conversation: Conversation
    reward: float = 0.0
    won: bool = False
    steps: int = 0
    done: bool = False
    truncated: bool = False  # out of turns or context before the env said done
    failure: str | None = None
    # The env's own account of how it ended unwon, where it gives one (BFCL: info "failure" and
    # "failure_message", e.g. a turn's state mismatch); "" otherwise.
    end_reason: str = ""
    feedback: list[tuple[int, str]] = dataclasses.field(default_factory=list)  # (episode step, kind)
    actions: list[str] = dataclasses.field(default_factory=list)  # the actions the env read
    # The env's own observation texts (before feedback): the reset one, then one per step.
    observations: list[str] = dataclasses.field(default_factory=list)
    # Step-wise representation: one conversation (rebuilt prompt + response) per model turn.
    rows: list[Conversation] = dataclasses.field(default_factory=list)

    def record_version(self, version: int) -> None:
        """Marks the tokens sampled since the last record, in every conversation of the episode,
        as policy `version`'s (`Conversation.record_version`)."""
        for conv in [self.conversation, *self.rows]:
            conv.record_version(version)

    def training_rows(self) -> list[Conversation]:
        """The token rows this episode trains on: its step rows, or its one trajectory."""
        return self.rows or ([self.conversation] if len(self.conversation) else [])
