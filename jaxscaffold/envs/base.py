"""The environment interface shared by every benchmark adapter and the pool.

An `Env` is stateful and single-threaded (one episode at a time); the pool runs each in its
own process. Model output reaching `step` is untrusted text: adapters parse it (e.g. with
`ast` for tool calls, a tag parser for `<action>`), never `eval` / `exec` it, and answer
unparsable or invalid actions with an observation that says so (`info["invalid"] = True`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Protocol


@dataclasses.dataclass(frozen=True)
class Task:
    """One episode's specification. Rollouts of a GRPO group share the same Task (and seed)."""

    env: str  # adapter name: "sciworld" | "bfcl" | "alfworld" | "tau2"
    task_id: str  # unique within (env, split)
    split: str  # the catalogue split it came from
    seed: int = 0
    spec: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # adapter-specific


@dataclasses.dataclass
class Observation:
    """What the agent sees (`text`) and, separately, what only the feedback layer may use."""

    text: str
    # e.g. "gold_actions", "goal_progress", "valid_actions", "tool_results", "turn"
    privileged: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class StepResult:
    observation: Observation
    reward: float
    done: bool
    # e.g. "won", "score", "invalid" (the action could not be parsed or executed), "steps"
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


class Env(Protocol):
    """A single-episode text environment."""

    name: str

    def reset(self, task: Task) -> Observation: ...

    def step(self, action_text: str) -> StepResult: ...

    def close(self) -> None: ...


class EnvError(RuntimeError):
    """An environment failed for infrastructure reasons (crash, hang, missing dependency),
    as opposed to the agent doing something invalid."""
