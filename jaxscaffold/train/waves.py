"""The sampler's size: at most `rollout.max_rows_in_flight` rows (whole groups), so its KV
cache (rows x max_len slots) is sized by that, not the step. The asynchronous driver runs a
whole step through those slots (a finished episode's slot goes to the next one); lock step
(`rollout.lockstep`) runs the groups in waves of that many rows. Row seeds and feedback
decisions are keyed by episode and group, so either samples what one pass would
(tests/train/test_waves.py)."""

from __future__ import annotations

from typing import Sequence


def groups_per_wave(rollout, groups: int) -> int:
    """Groups a wave holds of `groups` (this process's share): all of them, or as many whole
    groups as fit `max_rows_in_flight` rows (at least one)."""
    if rollout.max_rows_in_flight <= 0:
        return max(1, groups)
    return max(1, min(groups, rollout.max_rows_in_flight // rollout.group_size))


def sampler_rows(rollout, groups: int) -> int:
    """The sampler's slots for a share of `groups` groups: one wave's rows."""
    return groups_per_wave(rollout, groups) * rollout.group_size


def waves(groups: Sequence[int], per_wave: int) -> list[list[int]]:
    """`groups` in order, `per_wave` at a time."""
    groups = list(groups)
    return [groups[i:i + per_wave] for i in range(0, len(groups), per_wave)]
