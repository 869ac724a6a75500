"""What a schedule window counts, per env and feedback kind: each benchmark's own unit.

A window's bounds (`schedule.Window.episode_steps`) are positions in a unit:
  action     actions taken so far (the default; ScienceWorld, ALFWorld, tau2)
  user_turn  the index of the user turn the observation belongs to (BFCL AG: the reference code
             appends the hint to the user query of turns 0-2 when it builds the conversation)
  every      no position: every observation of the episode is inside while the window's
             training steps hold (BFCL OE: the reference enriches every tool result, and the
             gold replay, for the whole episode in its OE phase)
The paper's "steps 1-3 / 6-10" are ScienceWorld's pilot windows; for BFCL the paper, like the
code, puts AG on the user query and OE on the tool outputs. Each env declares its units in its
feedback spec (`enrichers.FeedbackSpec.units`).
"""

from __future__ import annotations

from jaxscaffold.envs.base import Observation
from jaxscaffold.feedback.enrichers import FEEDBACK, UNITS  # noqa: F401  (UNITS: the units' names)


def unit(env: str, kind: str) -> str:
    """The unit `kind`'s windows count in `env` (its feedback spec's; "action" by default)."""
    spec = FEEDBACK.get(env)
    return spec.units.get(kind, "action") if spec is not None else "action"


def position(env: str, kind: str, obs: Observation, episode_step: int) -> int | None:
    """Where `obs` lies in `kind`'s unit for `env` (None: inside every window)."""
    u = unit(env, kind)
    if u == "every":
        return None
    if u == "user_turn":
        return int(obs.privileged.get("turn", 0))
    return episode_step
