"""Enrichers: observation text + privileged state -> the enriched text the agent sees.

Each is an explicit function of (observation, the agent's actions so far); the privileged
state comes from the adapter (`Observation.privileged`). AG (action guidance) names a valid
next action; OE (observation enhancement) exposes hidden state such as sub-goal progress.
Reference-code forms reproduce the FEE code's text; paper forms follow the paper's text.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

from jaxscaffold.envs.base import Observation

Form = Callable[[Observation, Sequence[str]], str]
KINDS = ("ag", "oe")
UNITS = ("action", "user_turn", "every")  # what a schedule window counts (`feedback.units`)


@dataclasses.dataclass(frozen=True)
class FeedbackSpec:
    """Feedback's side of one environment, registered under the env's name (the env's own
    `envs.base.EnvSpec` knows nothing of it).

    forms      kind ("ag" / "oe") -> form name -> `form(observation, actions_so_far) -> text the
               agent sees` (reading the observation's privileged state); the first form of a
               kind is the env's default
    units      kind -> what its schedule windows count (`feedback.units`; default "action")
    env_hooks  constructor keyword -> "module:attribute" the env resolves in its own process:
               rules that must run where the env's state lives (`env_kwargs`)
    """

    forms: Mapping[str, Mapping[str, Form]]
    units: Mapping[str, str] = dataclasses.field(default_factory=dict)
    env_hooks: Mapping[str, str] = dataclasses.field(default_factory=dict)


# env name -> its FeedbackSpec; each env's forms below register theirs (`register_feedback`).
FEEDBACK: dict[str, FeedbackSpec] = {}


def register_feedback(env: str, spec: FeedbackSpec) -> None:
    """Adds (or replaces) environment `env`'s feedback (from outside the package too)."""
    for kind, forms in spec.forms.items():
        if kind not in KINDS:
            raise ValueError(f"{env}: feedback kind must be 'ag' or 'oe', got {kind!r}")
        if not forms or not all(callable(f) for f in forms.values()):
            raise ValueError(f"{env} {kind}: forms must map names to callables")
    for kind, unit in spec.units.items():
        if kind not in KINDS or unit not in UNITS:
            raise ValueError(f"{env}: unit {kind!r} -> {unit!r}; kinds {KINDS}, units {UNITS}")
    FEEDBACK[env] = FeedbackSpec({k: dict(f) for k, f in spec.forms.items()}, dict(spec.units), dict(spec.env_hooks))


def register_forms(env: str, kind: str, forms: Mapping[str, Form]) -> None:
    """Adds feedback forms of one kind ("ag" or "oe") to environment `env`'s feedback, keeping
    its other kind, units and hooks: `forms` name -> `form(observation, actions_so_far) -> text`.
    The first form is the env's default."""
    if kind not in KINDS:
        raise ValueError(f"feedback kind must be 'ag' or 'oe', got {kind!r}")
    old = FEEDBACK.get(env, FeedbackSpec({}))
    register_feedback(env, dataclasses.replace(old, forms={**old.forms, kind: forms}))

CAUTION = "[Caution!] Start with the following action to start your exploration!"


def gold_progress(gold: Sequence[str], actions: Sequence[str]) -> int:
    """How many leading gold actions the agent has done, in order (a subsequence match)."""
    k = 0
    for a in actions:
        if k < len(gold) and a.strip().lower() == gold[k].strip().lower():
            k += 1
    return k


def checklist(goals: Sequence[tuple[str, bool]]) -> str:
    """`[Pass]` / `[Pending]` lines and a `[k/n done]` summary."""
    lines = [f"[{'Pass' if done else 'Pending'}] {name}" for name, done in goals]
    return "\n".join(lines + [f"[{sum(d for _, d in goals)}/{len(goals)} done]"])


# ----------------------------------------------------------------------------- ScienceWorld


def sciworld_ag_reference(obs: Observation, actions: Sequence[str]) -> str:
    """The reference code: the first three gold actions, computed once at reset."""
    return f"{obs.text}\n{CAUTION}\n" + "\n".join(obs.privileged.get("ag_actions", [])[:3])


def sciworld_ag_paper(obs: Observation, actions: Sequence[str]) -> str:
    """The paper: a valid next action. With the env's AG guide (`privileged["ag_hint"]`,
    `feedback.sciworld_ag.GoldGuide`, wired by `env_kwargs`) the hint it derived from the
    current state, always valid at that moment (None: no hint); without it, the next gold
    action by how far the agent's actions follow the gold path fixed at reset (which may be
    invalid once the agent has left that path)."""
    if "ag_hint" in obs.privileged:
        hint = obs.privileged["ag_hint"]
        return f"{obs.text}\n[Hint] A valid next action: {hint}" if hint else obs.text
    gold = obs.privileged.get("gold_actions", [])
    k = gold_progress(gold, actions)
    if k >= len(gold):
        return obs.text
    return f"{obs.text}\n[Hint] A valid next action: {gold[k]}"


def sciworld_oe_checklist(obs: Observation, actions: Sequence[str]) -> str:
    goals = obs.privileged.get("goals") or {}
    items = [(g["description"], g["done"]) for g in goals.get("sequential", [])]
    if not items:
        return obs.text
    return f"{obs.text}\n[Task progress]\n{checklist(items)}"


def sciworld_oe_reference(obs: Observation, actions: Sequence[str]) -> str:
    return f"{obs.text}\n[Hint]Considering The current goal progress is {obs.privileged.get('goal_progress', '')}."


# The AG guide follows the episode where the simulator is, so that its hints are valid actions
# of the current state (computed only on the steps the episode's plan asks for).
register_feedback("sciworld", FeedbackSpec(
    forms={"ag": {"reference": sciworld_ag_reference, "paper": sciworld_ag_paper},
           "oe": {"checklist": sciworld_oe_checklist, "reference": sciworld_oe_reference}},
    env_hooks={"ag_guide": "jaxscaffold.feedback.sciworld_ag:GoldGuide"}))


# ----------------------------------------------------------------------------- ALFWorld


def alfworld_ag(obs: Observation, actions: Sequence[str]) -> str:
    nxt = obs.privileged.get("next_walkthrough_action")
    return f"{obs.text}\n[Hint] A valid next action: {nxt}" if nxt else obs.text


def alfworld_oe(obs: Observation, actions: Sequence[str]) -> str:
    goals = obs.privileged.get("goal_progress") or []
    items = [(g["name"], g["done"]) for g in goals]
    return f"{obs.text}\n[Task progress]\n{checklist(items)}" if items else obs.text


register_feedback("alfworld", FeedbackSpec(forms={"ag": {"paper": alfworld_ag}, "oe": {"checklist": alfworld_oe}}))


# ----------------------------------------------------------------------------- BFCL

BFCL_HINT = "Hint: considering start with the following operation:"
BFCL_MISS_FUNC = ("Hint: a function this request needs is not among the available functions; "
                  "say so instead of calling a wrong one.")
BFCL_MISS_PARAM = ("Hint: essential information for this request is missing; ask the user for it "
                   "instead of guessing.")


def bfcl_ag(obs: Observation, actions: Sequence[str]) -> str:
    """The reference code: on the user message of each of the first 3 turns, the turn's first
    gold call, or on a turn whose gold answer is empty the miss_func / miss_param hint. A
    miss_func turn that reveals the held-out functions has no user query: no hint (as in the
    reference, which appends to the turn's first user message)."""
    p = obs.privileged
    if p.get("message_role") != "user" or p.get("turn", 99) >= 3 or p.get("revealed_functions"):
        return obs.text
    gold = p.get("gold_calls") or []
    if gold:
        return f"{obs.text}\n{BFCL_HINT} {gold[0]}"
    category = p.get("category", "")
    if "miss_func" in category:
        return f"{obs.text}\n{BFCL_MISS_FUNC}"
    if "miss_param" in category:
        return f"{obs.text}\n{BFCL_MISS_PARAM}"
    return obs.text


def bfcl_oe(obs: Observation, actions: Sequence[str]) -> str:
    """The reference code: tool outputs enriched per class (current path and directory
    listing, success text for `None`, vehicle / trading / travel notes). The rules
    (`jaxscaffold.feedback.bfcl_oe`) run inside the env right after each call, where the
    backend instances live (also on the gold replay; see `env_kwargs`), and the env hands the
    enriched text over as `privileged["oe_text"]`; this swaps it in on tool-output
    observations (BFCL AG never changes those) and leaves user messages unchanged."""
    p = obs.privileged
    if p.get("message_role") != "tool":
        return obs.text
    return p.get("oe_text", obs.text)


# AG on the user query of turns 0-2, OE on every tool result of the episode (`feedback.units`);
# the OE rules run inside the env, right after each call, where the backend instances live.
register_feedback("bfcl", FeedbackSpec(
    forms={"ag": {"reference": bfcl_ag}, "oe": {"reference": bfcl_oe}}, units={"ag": "user_turn", "oe": "every"},
    env_hooks={"oe_transform": "jaxscaffold.feedback.bfcl_oe:enrich_result"}))


# ----------------------------------------------------------------------------- tau2


def tau2_oe(obs: Observation, actions: Sequence[str]) -> str:
    """The current DB records the episode has touched so far (an order, a user, a
    reservation, ...; most recent last) and, in telecom, the user's phone, from
    `privileged["db_state"]` (computed by `jaxscaffold.envs.tau2` after every step)."""
    state = obs.privileged.get("db_state") or {}
    lines = [f"{r['table']} {r['id']}: {r['summary']}" for r in state.get("records", [])]
    for key, label in (("user_device", "user's phone"), ("user_surroundings", "user's surroundings")):
        if state.get(key):
            lines.append(f"{label}: {state[key]}")
    return f"{obs.text}\n[Current DB state]\n" + "\n".join(lines) if lines else obs.text


register_feedback("tau2", FeedbackSpec(forms={"oe": {"db_state": tau2_oe}}))


DEFAULT_FORMS = {"ag": "paper", "oe": "checklist"}


def form_names(kind: str) -> list[str]:
    """Every form of feedback `kind` some env has (what `feedback.{kind}_form` may name; an env
    without the chosen form uses its own first one)."""
    return sorted({form for spec in FEEDBACK.values() for form in spec.forms.get(kind, {})})


def enricher(env: str, forms: dict[str, str] | None = None) -> Callable | None:
    """`(kind, observation, episode_step, actions) -> text` for an environment, or None
    when it has no enrichers (feedback then never applies to it)."""
    forms = {**DEFAULT_FORMS, **(forms or {})}
    spec = FEEDBACK.get(env, FeedbackSpec({}))
    table = {kind: spec.forms.get(kind, {}) for kind in KINDS}
    if not any(table.values()):
        return None

    def enrich(kind: str, obs: Observation, episode_step: int, actions: Sequence[str]) -> str:
        options = table[kind]
        if not options:
            return obs.text
        form = forms[kind] if forms[kind] in options else next(iter(options))
        return options[form](obs, actions)

    return enrich


def env_kwargs(kwargs: Mapping[str, Mapping] | None = None) -> dict[str, dict]:
    """Env name -> constructor kwargs: the feedback specs' `env_hooks` under the given ones
    (which win, e.g. `{"bfcl": {"oe_transform": None}}` turns BFCL's OE computation off)."""
    kwargs = kwargs or {}
    hooks = {name: dict(spec.env_hooks) for name, spec in FEEDBACK.items() if spec.env_hooks}
    return {name: {**hooks.get(name, {}), **dict(kwargs.get(name, {}))} for name in {*hooks, *kwargs}}


def jsonl_hint(obs: Observation, actions: Sequence[str]) -> str:
    """AG for JSONL tasks: the line's own "hint" field, when it has one."""
    hint = (obs.privileged.get("item") or {}).get("hint")
    return f"{obs.text}\nHint: {hint}" if isinstance(hint, str) and hint.strip() else obs.text


register_feedback("jsonl", FeedbackSpec(forms={"ag": {"hint": jsonl_hint}}))


def rooms_ag(obs: Observation, actions: Sequence[str]) -> str:
    """The rooms testbed: the first action of a shortest plan from the current state."""
    nxt = obs.privileged.get("next_walkthrough_action")
    return f"{obs.text}\nHint: {nxt}" if nxt else obs.text


def rooms_oe(obs: Observation, actions: Sequence[str]) -> str:
    goals = obs.privileged.get("goals") or []
    items = [(g["description"], g["done"]) for g in goals]
    return f"{obs.text}\n[Task progress]\n{checklist(items)}" if items else obs.text


register_feedback("rooms", FeedbackSpec(forms={"ag": {"paper": rooms_ag}, "oe": {"checklist": rooms_oe}}))
