"""Gold policies: each benchmark's own gold / expert path played through the agent's
interface (the same action text an agent would write), a sanity check of the adapters."""

from __future__ import annotations

from jaxscaffold.envs.base import Observation

# Gold plays BFCL in its Python call-list format (the gold answers are Python call strings),
# and gold paths longer than the training step limits must not be cut.
GOLD_ENV_KWARGS = {"bfcl": {"tool_format": "python"}, "sciworld": {"step_limit": 1000},
                   "alfworld": {"step_limit": 1000}}


class GoldPolicy:
    """One episode's gold actions; `act(observation)` returns the next action text."""

    def __init__(self, env: str, first: Observation):
        self.env, self.k = env, 0
        self.plan = list(first.privileged.get("gold_actions", []))
        if env in ("sciworld", "alfworld") and not self.plan:
            raise ValueError(f"{env}: the reset observation carries no gold_actions")

    def act(self, obs: Observation) -> str:
        if self.env == "bfcl":
            if obs.privileged.get("message_role") == "user" and obs.privileged.get("gold_calls"):
                return "[" + ", ".join(obs.privileged["gold_calls"]) + "]"
            return "Done."  # a text reply ends the turn
        if self.env == "letters":
            return "e" * 32
        action = self.plan[self.k] if self.k < len(self.plan) else "look around"
        self.k += 1
        return f"<action>{action}</action>"
