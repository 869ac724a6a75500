"""Gold policies: each benchmark's own gold / expert path played through the agent's
interface (the same action text an agent would write), a sanity check of the adapters."""

from __future__ import annotations

import json

from jaxscaffold.envs.actions import action_text
from jaxscaffold.envs.base import Observation

# Gold plays BFCL in its Python call-list format (the gold answers are Python call strings),
# and gold paths longer than the training step limits must not be cut.
GOLD_ENV_KWARGS = {"bfcl": {"tool_format": "python"}, "sciworld": {"step_limit": 1000},
                   "alfworld": {"step_limit": 1000}, "tau2": {"max_steps": 1000}}


class GoldPolicy:
    """One episode's gold actions; `act(observation)` returns the next action text."""

    def __init__(self, env: str, first: Observation):
        self.env, self.k = env, 0
        self.first_item = first.privileged.get("item") or {}  # a JSONL task's line
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
        if self.env == "jsonl":  # the line's "answer" (its first, when it lists several)
            answer = (obs.privileged.get("item") or self.first_item).get("answer", "")
            return str(answer[0] if isinstance(answer, list) and answer else answer)
        if self.env == "tau2":
            return self._tau2(obs)
        action = self.plan[self.k] if self.k < len(self.plan) else "look around"
        self.k += 1
        return action_text(action)

    def _tau2(self, obs: Observation) -> str:
        """tau2: the gold tool calls one per step (user-side ones too: without a user, telecom
        runs solo, where the agent has the phone's tools), then one message with the facts to
        communicate, then `done`. A user's reply never changes the plan."""
        if self.k < len(self.plan):
            action = self.plan[self.k]
            self.k += 1
            call = {"name": action["name"], "arguments": action["arguments"]}
            return f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>"
        facts = obs.privileged.get("gold_communicate") or []
        if self.k == len(self.plan) and facts:
            self.k += 1
            return " ".join(facts)
        self.k += 1
        return '<tool_call>\n{"name": "done", "arguments": {}}\n</tool_call>'


# tools whose call ends a tau2 episode: never a probe
_TAU2_ENDING = ("done", "transfer_to_human_agents")


def tau2_probe_call(first: Observation, draw) -> str | None:
    """A tau2 exploration step off the gold path: one of the agent's tools (from the reset
    observation's `tools`) whose required arguments all appear in the task's gold calls, called
    with such values (`draw(n)` picks below n): a real lookup or change of another record, or
    the tool's own error. None when no tool qualifies."""
    values: dict[str, list] = {}
    for a in first.privileged.get("gold_actions", []):
        for k, v in (a.get("arguments") or {}).items():
            values.setdefault(k, []).append(v)
    tools = []
    for schema in first.privileged.get("tools", []):
        fn = schema["function"]
        required = list(fn.get("parameters", {}).get("required") or [])
        if fn["name"] not in _TAU2_ENDING and all(r in values for r in required):
            tools.append((fn["name"], required))
    if not tools:
        return None
    name, required = tools[draw(len(tools))]
    call = {"name": name, "arguments": {r: values[r][draw(len(values[r]))] for r in required}}
    return f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>"
