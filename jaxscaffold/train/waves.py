"""Rollouts in waves: a step's groups sampled at most `rollout.max_rows_in_flight` rows at
a time, whole groups per wave, so the sampler's KV cache (rows x max_len slots) is sized by
the wave, not the step. Row seeds and feedback decisions are keyed by episode and group, so
waves sample what one pass would (tests/train/test_waves.py)."""

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
