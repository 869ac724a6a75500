"""A learnable feedback schedule: a bandit over feedback arms (beyond the paper, which names
a learned schedule as future work).

Each arm is a schedule (e.g. `none`, `ag_early`, `ag_late`, `oe_early`, `oe_late`). Every
training step each group is given one arm by Thompson sampling from Beta posteriors; after
the step the group reports a learning signal in [0, 1] and its arm's posterior is updated.
The default signal is whether the group was *informative* (its rewards were not all equal,
so GRPO had a non-zero advantage to learn from: `rl.advantages.informative` on the rewards),
the quantity feedback exists to raise.
Posteriors are discounted every step so the bandit can follow the paper's finding that the
best feedback changes over training (AG early, OE late).

State is explicit and serialisable (`to_dict` / `from_dict`) to live in checkpoints; choices
are drawn from (run seed, training step, group id), so they are reproducible.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

DEFAULT_ARMS = ("none", "ag_early", "ag_late", "oe_early", "oe_late")


@dataclasses.dataclass(frozen=True)
class BanditState:
    arms: tuple[str, ...]
    alpha: tuple[float, ...]  # Beta posterior successes (+ prior) per arm
    beta: tuple[float, ...]  # Beta posterior failures (+ prior) per arm
    discount: float = 0.95  # per training step, towards the prior
    prior: float = 1.0

    @staticmethod
    def create(arms: Sequence[str] = DEFAULT_ARMS, *, discount: float = 0.95, prior: float = 1.0) -> "BanditState":
        if not 0.0 < discount <= 1.0:
            raise ValueError(f"discount {discount} outside (0, 1]")
        n = len(arms)
        return BanditState(tuple(arms), (prior,) * n, (prior,) * n, discount, prior)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "BanditState":
        return BanditState(tuple(d["arms"]), tuple(d["alpha"]), tuple(d["beta"]), d["discount"], d["prior"])

    def means(self) -> np.ndarray:
        a, b = np.asarray(self.alpha), np.asarray(self.beta)
        return a / (a + b)


def choose(state: BanditState, *, run_seed: int, train_step: int, group_id: int) -> str:
    """The arm for one group this step: argmax of one Thompson draw per arm."""
    seq = np.random.SeedSequence([run_seed & 0xFFFFFFFF, train_step, group_id, 0xBA])
    rng = np.random.Generator(np.random.Philox(seq))
    draws = rng.beta(np.asarray(state.alpha), np.asarray(state.beta))
    return state.arms[int(np.argmax(draws))]


def update(state: BanditState, outcomes: Sequence[tuple[str, float]]) -> BanditState:
    """Discounts the posteriors once (one training step) and adds each group's signal."""
    a = state.prior + state.discount * (np.asarray(state.alpha) - state.prior)
    b = state.prior + state.discount * (np.asarray(state.beta) - state.prior)
    for arm, signal in outcomes:
        if not 0.0 <= signal <= 1.0:
            raise ValueError(f"bandit signal {signal} outside [0, 1]")
        i = state.arms.index(arm)
        a[i] += signal
        b[i] += 1.0 - signal
    return dataclasses.replace(state, alpha=tuple(map(float, a)), beta=tuple(map(float, b)))

