"""DAPO's sampling-side tricks (arXiv 2503.14476): overlong reward shaping and dynamic sampling.

Both run on the host between rollout and loss; they see numbers and opaque payloads only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxscaffold.rl import advantages


def overlong_penalty(lengths_N, max_len: int, buffer: int, factor: float = 1.0):
    """Soft overlong penalty added to the reward, counted in TOKENS: `penalty_N` <= 0.

    `min(-(len - (max_len - buffer)) / buffer * factor, 0)`: zero up to `max_len - buffer`
    tokens, then linear down to `-factor` at `max_len`. Beyond `max_len` (only possible when
    the caller counts more than the response budget, e.g. several turns) it stays at
    `-factor`, as in the DAPO paper's piecewise definition.
    """
    if not 0 < buffer <= max_len:
        raise ValueError(f"need 0 < buffer <= max_len, got buffer={buffer}, max_len={max_len}")
    lengths_N = np.asarray(lengths_N, np.float64)
    exceed_N = lengths_N - (max_len - buffer)
    return np.clip(-exceed_N / buffer * factor, -factor, 0.0)


class DynamicSamplingExhausted(RuntimeError):
    """Raised when `max_num_gen_batches` generation batches did not yield enough groups."""


@dataclasses.dataclass(frozen=True)
class SampledGroups:
    """What `DynamicSampler.take` returns: the kept groups and how they were collected."""

    payloads: list  # one per kept group, in arrival order (target_groups, unless taken partial)
    successes: list  # the binary successes of each kept group
    num_gen_batches: int  # generation batches consumed
    num_seen: int  # groups offered
    num_dropped_all_zero: int  # groups where every rollout failed
    num_dropped_all_one: int  # groups where every rollout succeeded
    num_overflow: int  # informative groups beyond the target (discarded)

    @property
    def num_dropped(self) -> int:
        return self.num_dropped_all_zero + self.num_dropped_all_one


def informative(successes_G) -> bool:
    """A group teaches something only if its binary successes are not all equal
    (`advantages.informative` on the successes, which must be binary)."""
    return advantages.informative(_binary(successes_G))


def _binary(successes_G):
    s = np.asarray(successes_G)
    if s.ndim != 1 or s.size == 0:
        raise ValueError(f"a group's successes must be a non-empty 1-D array, got shape {s.shape}")
    if s.dtype != bool and not np.isin(s, (0, 1)).all():
        # Filtering on a shaped reward (e.g. with an overlong penalty) keeps groups that only
        # differ in length: DAPO filters on the binary outcome.
        raise ValueError(f"dynamic sampling filters on BINARY success (0/1), got {s.tolist()}")
    return s.astype(np.int8)


class DynamicSampler:
    """Collects informative groups across generation batches until `target_groups` are in.

    Usage per training step:
        sampler = DynamicSampler(target_groups=16, max_num_gen_batches=10)
        while not sampler.full():
            sampler.add(successes_per_group, payloads)  # one generation batch
        batch = sampler.take()

    Groups whose successes are all 0 or all 1 give zero group-relative advantage and are
    dropped (a group of one is always dropped). After `max_num_gen_batches` batches without
    reaching the target, `add` raises `DynamicSamplingExhausted`; `max_num_gen_batches` <= 0
    or None means no limit (as verl). Informative groups beyond the target are discarded.
    """

    def __init__(self, target_groups: int, max_num_gen_batches: int | None = 10):
        if target_groups <= 0:
            raise ValueError(f"target_groups must be positive, got {target_groups}")
        self.target_groups = target_groups
        self.max_num_gen_batches = max_num_gen_batches
        self._reset()

    def _reset(self):
        self._payloads: list[Any] = []
        self._successes: list[np.ndarray] = []
        self.num_gen_batches = 0
        self.num_seen = 0
        self.num_dropped_all_zero = 0
        self.num_dropped_all_one = 0
        self.num_overflow = 0

    @property
    def num_kept(self) -> int:
        return len(self._payloads)

    @property
    def num_dropped(self) -> int:
        return self.num_dropped_all_zero + self.num_dropped_all_one

    def full(self) -> bool:
        return self.num_kept >= self.target_groups

    def add(self, successes, payloads=None) -> int:
        """Adds one generation batch: `successes[i]` are group i's binary outcomes, `payloads[i]`
        whatever the caller needs back (its rollouts). Returns the number of groups kept."""
        if self.full():
            raise RuntimeError("the sampler is already full: call take() before adding more")
        successes = list(successes)
        payloads = [None] * len(successes) if payloads is None else list(payloads)
        if len(payloads) != len(successes):
            raise ValueError(f"{len(successes)} groups of successes but {len(payloads)} payloads")
        self.num_gen_batches += 1
        kept = 0
        for s, payload in zip(successes, payloads):
            s = _binary(s)
            self.num_seen += 1
            if not advantages.informative(s):
                if s[0]:
                    self.num_dropped_all_one += 1
                else:
                    self.num_dropped_all_zero += 1
            elif self.full():
                self.num_overflow += 1
            else:
                self._payloads.append(payload)
                self._successes.append(s)
                kept += 1
        limit = self.max_num_gen_batches
        if not self.full() and limit is not None and 0 < limit <= self.num_gen_batches:
            raise DynamicSamplingExhausted(
                f"dynamic sampling collected {self.num_kept}/{self.target_groups} informative groups "
                f"after {self.num_gen_batches} generation batches (max_num_gen_batches={limit}); "
                f"dropped {self.num_dropped} of {self.num_seen} groups "
                f"({self.num_dropped_all_zero} all-fail, {self.num_dropped_all_one} all-success)"
            )
        return kept

    def take(self, partial: bool = False) -> SampledGroups:
        """The `target_groups` kept groups and the counts; resets the sampler for the next step.
        `partial`: the groups kept so far, fewer when generation stopped short of the target
        (the reference trains on what it has after its last generation batch)."""
        if not (self.full() or partial):
            raise RuntimeError(f"only {self.num_kept}/{self.target_groups} groups collected: keep adding")
        out = SampledGroups(
            payloads=self._payloads,
            successes=self._successes,
            num_gen_batches=self.num_gen_batches,
            num_seen=self.num_seen,
            num_dropped_all_zero=self.num_dropped_all_zero,
            num_dropped_all_one=self.num_dropped_all_one,
            num_overflow=self.num_overflow,
        )
        self._reset()
        return out
