"""What the agent is shown: an observation, enriched where the schedule and the group's coin
say so. One `Feedback` serves one batch of episodes at one training step.

For each kind the schedule has active at (training step, episode step), `randomization`
decides (one coin per group by default) whether the episode gets it; the env's enricher then
rewrites the text. A kind counts as applied only when the text really changed.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

from jaxscaffold.envs.base import Observation
from jaxscaffold.feedback import randomization
from jaxscaffold.feedback.schedule import Schedule

# (kind, observation, episode step, the agent's actions so far) -> the enriched text
Enricher = Callable[[str, Observation, int, Sequence[str]], str]


@dataclasses.dataclass(frozen=True)
class Shown:
    """The text the agent sees and the feedback kinds that changed it (in schedule order)."""

    text: str
    applied: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Feedback:
    """The feedback of one batch: `schedule` (None: the standard env, text unchanged), the
    env name -> enricher table (an env without one never gets feedback), the randomisation
    mode and what its decisions are keyed on (run seed, training step, number of groups)."""

    schedule: Schedule | None
    enrichers: Mapping[str, Enricher] = dataclasses.field(default_factory=dict)
    mode: str = "group"
    run_seed: int = 0
    train_step: int = 0
    num_groups: int = 0

    def show(self, obs: Observation, *, env: str, group: int, rollout: int, episode_step: int,
             actions: Sequence[str]) -> Shown:
        """What rollout `rollout` of group `group` sees of `obs` at `episode_step` (actions
        taken so far: `actions`)."""
        text, applied = obs.text, []
        if self.schedule is None:
            return Shown(text)
        enrich = self.enrichers.get(env)
        for kind in self.schedule.active_kinds(self.train_step, episode_step):
            p = self.schedule.probability(kind, self.train_step)
            if enrich is not None and randomization.decide(
                    self.mode, p, run_seed=self.run_seed, train_step=self.train_step, group_id=group,
                    num_groups=self.num_groups, rollout=rollout, kind=kind):
                enriched = enrich(kind, dataclasses.replace(obs, text=text), episode_step, actions)
                if enriched != text:  # counted only when the agent really sees something more
                    applied.append(kind)
                text = enriched
        return Shown(text, tuple(applied))


NONE = Feedback(None)  # the standard environment (evaluation, data collection)
