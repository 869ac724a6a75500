"""Feedback schedules as data: which feedback is active at (training step, episode step).

Episode steps count the actions taken so far: the observation after reset is episode step 0,
the one after the first action step 1. The paper's "steps 1-3" are the observations the agent
acts on at its first three actions (episode steps 0-2) and "steps 6-10" episode steps 5-9;
the reference code tests `0 <= steps_taken <= 3` and `6 <= steps_taken <= 10` on the same
counter, offered as the `*_reference` schedules.

Training steps are 1-based optimizer steps ("the first 100 steps" = 1..100).

An env may count a kind's window in its own unit (`feedback.units`: BFCL AG in user turns,
BFCL OE on every tool result); `active_kinds(..., positions=...)` takes those positions.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

KINDS = ("ag", "oe")


@dataclasses.dataclass(frozen=True)
class Window:
    """Feedback `kind` on episode steps [first, last] during training steps [start, end].

    `probability` is the chance that a group gets it; `anneal` = (a, b) decays that chance
    linearly to 0 between training steps a and b (beyond the paper)."""

    kind: str
    episode_steps: tuple[int, int]
    train_steps: tuple[int, int | None] = (1, None)  # None: no end
    probability: float = 0.5
    anneal: tuple[int, int] | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"feedback kind {self.kind!r} is not one of {KINDS}")
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"probability {self.probability} outside [0, 1]")
        if self.episode_steps[0] > self.episode_steps[1]:
            raise ValueError(f"empty episode window {self.episode_steps}")

    def covers_train_step(self, train_step: int) -> bool:
        start, end = self.train_steps
        return train_step >= start and (end is None or train_step <= end)

    def covers(self, train_step: int, episode_step: int | None) -> bool:
        """`episode_step`: the position in the window's unit (None: every position is inside)."""
        first, last = self.episode_steps
        inside = episode_step is None or first <= episode_step <= last
        return self.covers_train_step(train_step) and inside

    def probability_at(self, train_step: int) -> float:
        if not self.covers_train_step(train_step):
            return 0.0
        if self.anneal is None:
            return self.probability
        a, b = self.anneal
        if train_step <= a:
            return self.probability
        if train_step >= b:
            return 0.0
        return self.probability * (b - train_step) / (b - a)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A named set of windows (no windows: the standard environment)."""

    name: str
    windows: tuple[Window, ...] = ()

    def windows_at(self, train_step: int) -> tuple[Window, ...]:
        """The windows live at this training step (with a non-zero probability)."""
        return tuple(w for w in self.windows if w.probability_at(train_step) > 0)

    def active_kinds(self, train_step: int, episode_step: int,
                     positions: Mapping[str, int | None] | None = None) -> tuple[str, ...]:
        """Kinds whose window covers this point (before the per-group coin flip). `positions`
        gives a kind's position in its env's own unit instead of `episode_step` (None: every
        position; `feedback.units.position`)."""
        positions = positions or {}
        return tuple(sorted({w.kind for w in self.windows
                             if w.covers(train_step, positions.get(w.kind, episode_step))
                             and w.probability_at(train_step) > 0}))

    def probability(self, kind: str, train_step: int) -> float:
        """The chance a group gets `kind` at this training step (max over its windows)."""
        return max((w.probability_at(train_step) for w in self.windows if w.kind == kind), default=0.0)


EARLY, LATE = (0, 2), (5, 9)  # the paper's episode steps 1-3 and 6-10
EARLY_REF, LATE_REF = (0, 3), (6, 10)  # the reference code's bounds
SWITCH = 100  # training step of the AG -> OE switch (of 200)
NAMES = ("none", "ag_early", "ag_late", "oe_early", "oe_late", "ag_early_oe_late", "ag_early_oe_late_reference")


def make(name: str, *, p: float = 0.5, switch: int = SWITCH, anneal: tuple[int, int] | None = None) -> Schedule:
    """A named schedule: `none`; the pilot grid `ag_early`, `ag_late`, `oe_early`, `oe_late`
    (one kind, one timing, all of training); the paper default `ag_early_oe_late` (AG on
    early episode steps up to training step `switch`, OE on late ones after it) and
    `ag_early_oe_late_reference` (the reference code's bounds). `anneal` decays every
    window's probability to 0 over the given training-step range."""
    def w(kind, steps, train=(1, None)):
        return Window(kind, steps, train, p, anneal)

    table = {
        "none": (),
        "ag_early": (w("ag", EARLY),),
        "ag_late": (w("ag", LATE),),
        "oe_early": (w("oe", EARLY),),
        "oe_late": (w("oe", LATE),),
        "ag_early_oe_late": (w("ag", EARLY, (1, switch)), w("oe", LATE, (switch + 1, None))),
        "ag_early_oe_late_reference": (w("ag", EARLY_REF, (1, switch)), w("oe", LATE_REF, (switch + 1, None))),
    }
    assert set(table) == set(NAMES)
    if name not in table:
        raise ValueError(f"unknown feedback schedule {name!r}; known: {sorted(table)}")
    return Schedule(name, table[name])


PILOT_GRID = ("ag_early", "ag_late", "oe_early", "oe_late", "ag_early_oe_late")
