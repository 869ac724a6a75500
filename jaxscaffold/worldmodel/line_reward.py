"""The `lines` world-model reward, for fully templated text states (the rooms testbed).

A rooms state is a fixed template filled from the world (`envs/rooms.describe`): one line
per fact (the room, each door and whether it is locked, each container and what is in it,
the floor, what is carried, the valid actions). A sentence embedder barely moves when one
of those words changes ("the red room" / "the blue room"), and the facts of `facts.py`
(numbered objects, "is open") miss most of them, so for such states the exact comparison is
both possible and the only sound one: d = the share of lines that differ (1 - the multiset
overlap of the whitespace-normalised lines over the longer side's count), r = 1 if d < tau_d
(0.01: every line right; the line order is free, as facts are sets). An answer without a
well-formed `<next_state>` scores MAX_DISTANCE, as with the embedding reward.
"""

from __future__ import annotations

import collections
from typing import Sequence

import numpy as np

from jaxscaffold.worldmodel.reward import MAX_DISTANCE
from jaxscaffold.worldmodel.task import parse_prediction


def state_lines(text: str) -> collections.Counter:
    """The non-empty lines of a state, whitespace collapsed, counted."""
    return collections.Counter(" ".join(line.split()) for line in text.splitlines() if line.strip())


def line_distance(prediction: str, target: str) -> float:
    """The share of lines that differ, 0 (the same lines) to 1 (none shared)."""
    a, b = state_lines(prediction), state_lines(target)
    longest = max(sum(a.values()), sum(b.values()))
    return 0.0 if longest == 0 else 1.0 - sum((a & b).values()) / longest


def line_rewards_with_counts(answers: Sequence[str], targets: Sequence[str], tau_d: float
                             ) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """(rewards, distances, counts) of raw model answers against the real next states, in the
    embedding reward's shape (no chunking, so no counts)."""
    if len(answers) != len(targets):
        raise ValueError(f"{len(answers)} answers for {len(targets)} targets")
    distances = np.full(len(answers), MAX_DISTANCE)
    for i, (a, t) in enumerate(zip(answers, targets)):
        p = parse_prediction(a)
        if p is not None:
            distances[i] = line_distance(p, t)
    return (distances < tau_d).astype(np.float64), distances, {}
