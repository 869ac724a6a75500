"""Who gets feedback: one decision per GRPO group, reproducible anywhere.

The paper's finding: feedback applied with probability p must be the same for every rollout
of a group, or the group-relative advantage compares rollouts that saw different
environments. Decisions are a pure function of (run seed, training step, group id, kind),
drawn from a counter-based generator, so every host and every restart agrees.

Modes:
  group       one coin per group (the paper; default)
  rollout     one coin per rollout (the "inconsistent" ablation)
  first_half  the first half of the groups (the reference code on ScienceWorld)
  even        even-indexed rollouts of every group (the reference code's inconsistent ablation)
"""

from __future__ import annotations

import numpy as np

from jaxscaffold.feedback.schedule import KINDS

MODES = ("group", "rollout", "first_half", "even")


def uniform(run_seed: int, train_step: int, group_id: int, kind: str, rollout: int = -1) -> float:
    """A U[0, 1) number determined by its arguments alone."""
    seq = np.random.SeedSequence([run_seed & 0xFFFFFFFF, train_step, group_id, KINDS.index(kind), rollout + 1])
    return float(np.random.Generator(np.random.Philox(seq)).random())


def decide(mode: str, p: float, *, run_seed: int, train_step: int, group_id: int, num_groups: int,
           rollout: int, kind: str) -> bool:
    """Whether rollout `rollout` of group `group_id` gets feedback `kind` this step."""
    if mode == "group":
        return uniform(run_seed, train_step, group_id, kind) < p
    if mode == "rollout":
        return uniform(run_seed, train_step, group_id, kind, rollout) < p
    if mode == "first_half":
        return group_id < num_groups // 2
    if mode == "even":
        return rollout % 2 == 0
    raise ValueError(f"unknown randomization mode {mode!r}; known: {MODES}")
