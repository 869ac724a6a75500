"""What the agent is shown: an observation, enriched where the schedule and the group's coin
say so. One `Feedback` serves one batch of episodes at one training step.

For each kind the schedule has active at (training step, episode step), `randomization`
decides (one coin per group by default) whether the episode gets it; the env's enricher then
rewrites the text. A kind counts as applied only when the text really changed. Windows
count in each env's own unit (`units`: ScienceWorld actions taken, BFCL user turns for AG and
every tool result for OE).

`prepare` tells an episode's env, at reset, what it is planned to get (`task.spec["feedback"]`:
kind -> the windows in the env's unit, None for the whole episode): BFCL then compares
enriched with enriched outputs in its response check when OE is on, and ScienceWorld computes
its AG hints only on the steps that may show them.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

from jaxscaffold.envs.base import Observation, Task
from jaxscaffold.feedback import randomization, units
from jaxscaffold.feedback.schedule import KINDS, Schedule

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
        positions = {k: units.position(env, k, obs, episode_step) for k in KINDS}
        for kind in self.schedule.active_kinds(self.train_step, episode_step, positions):
            if enrich is not None and self.gets(kind, group=group, rollout=rollout):
                enriched = enrich(kind, dataclasses.replace(obs, text=text), episode_step, actions)
                if enriched != text:  # counted only when the agent really sees something more
                    applied.append(kind)
                text = enriched
        return Shown(text, tuple(applied))

    def gets(self, kind: str, *, group: int, rollout: int) -> bool:
        """The coin of (group, rollout) for `kind` at this training step."""
        p = self.schedule.probability(kind, self.train_step) if self.schedule is not None else 0.0
        return p > 0 and randomization.decide(
            self.mode, p, run_seed=self.run_seed, train_step=self.train_step, group_id=group,
            num_groups=self.num_groups, rollout=rollout, kind=kind)

    def plan(self, env: str, *, group: int, rollout: int) -> dict[str, list[tuple[int, int]] | None]:
        """Kind -> where the episode may get it: the live windows' bounds in the env's unit, or
        None (every observation); only kinds the env has an enricher for and the coin gives."""
        if self.schedule is None or env not in self.enrichers:
            return {}
        out: dict[str, list[tuple[int, int]] | None] = {}
        for kind in KINDS:
            windows = [w.episode_steps for w in self.schedule.windows_at(self.train_step) if w.kind == kind]
            if windows and self.gets(kind, group=group, rollout=rollout):
                out[kind] = None if units.unit(env, kind) == "every" else windows
        return out

    def prepare(self, task: Task, *, group: int, rollout: int) -> Task:
        """`task` with its feedback plan in `spec["feedback"]` (unchanged when there is none)."""
        plan = self.plan(task.env, group=group, rollout=rollout)
        if not plan:
            return task
        return dataclasses.replace(task, spec={**task.spec, "feedback": plan})


NONE = Feedback(None)  # the standard environment (evaluation, data collection)
