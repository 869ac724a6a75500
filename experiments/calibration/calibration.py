"""Calibrating tau_d for an embedder on real transitions: how far paraphrases of a next state
land from it, against other states of the same game and of other games, and against near
misses (the real next state with one fact wrong: a flipped open / closed, an item dropped or
added, a wrong object number or receptacle, another action's outcome; for tau2's tool results,
`tool_states`: a changed JSON value, id or status, a flipped device state or changed number in
a text result), and what a template that only echoes the action earns.

The paper's thresholds (ALFWorld 0.1 / 0.2) were set for Qwen3-Embedding-8B; a different
embedder spreads distances differently, so `calibrate.py` beside it measures the classes
below on real ALFWorld triples and picks the threshold that separates them best.
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

import numpy as np

from jaxscaffold.worldmodel import tool_states
from jaxscaffold.worldmodel.embedders import Embedder
from jaxscaffold.worldmodel.facts import same_facts
from jaxscaffold.worldmodel.reward import cosine_distances
from jaxscaffold.worldmodel.triples import Triple

# Meaning-preserving rewrites of ALFWorld's phrasing.
SYNONYMS = [
    ("You arrive at", "You reach"), ("you see", "you notice"), ("You pick up", "You take"),
    ("You put", "You place"), ("is open", "is now open"), ("is closed", "is shut"),
    ("Nothing happens.", "Nothing changes."), ("Looking quickly around you", "Glancing around"),
]
_LIST = re.compile(r"(you see )(.+?)(\.)")


def reorder_items(text: str, rng: np.random.Generator) -> str:
    """"you see a X, a Y, and a Z." with the items in another order (same set)."""
    def shuffle(m):
        items = re.split(r", and |, | and ", m.group(2))
        if len(items) < 2:
            return m.group(0)
        perm = list(rng.permutation(len(items)))
        if perm == list(range(len(items))):
            perm = perm[1:] + perm[:1]
        items = [items[i] for i in perm]
        return m.group(1) + ", ".join(items[:-1]) + ", and " + items[-1] + m.group(3)
    return _LIST.sub(shuffle, text)


def paraphrase(text: str, rng: np.random.Generator) -> str:
    """Items reordered, then phrases swapped for synonyms: the same state in other words (tau2's
    tool results: `tool_states.paraphrase`, JSON keys in another order)."""
    if tool_states.blocks(text) is not None:
        return tool_states.paraphrase(text, int(rng.integers(2**31)))
    out = reorder_items(text, rng)
    for a, b in SYNONYMS:
        out = out.replace(a, b)
    return out


def class_pairs(triples: Sequence[Triple], seed: int = 0) -> dict[str, tuple[list[str], list[str]]]:
    """(next states, their counterparts) per class: each distinct next state's paraphrase
    ("paraphrase", should pass); another next state of the same game ("same_game", usually
    another receptacle or object); a next state of another game ("other_game")."""
    rng = np.random.default_rng(seed)
    states = {}
    for t in triples:
        states.setdefault(t.next_state, t.task_id)
    texts = list(states)
    by_game: dict[str, list[str]] = {}
    for s, g in states.items():
        by_game.setdefault(g, []).append(s)
    pairs: dict[str, tuple[list[str], list[str]]] = {"paraphrase": ([], []), "same_game": ([], []),
                                                     "other_game": ([], [])}
    for s in texts:
        p = paraphrase(s, rng)
        if p != s:
            pairs["paraphrase"][0].append(s)
            pairs["paraphrase"][1].append(p)
        same = [o for o in by_game[states[s]] if o != s]
        if same:
            pairs["same_game"][0].append(s)
            pairs["same_game"][1].append(same[rng.integers(len(same))])
        other = [o for o in texts if states[o] != states[s] and o != s]
        if other:
            pairs["other_game"][0].append(s)
            pairs["other_game"][1].append(other[rng.integers(len(other))])
    return pairs


def distance_classes(embedder: Embedder, triples: Sequence[Triple], seed: int = 0) -> dict[str, np.ndarray]:
    """The distances of `class_pairs`' classes."""
    return {k: cosine_distances(embedder, a, b) for k, (a, b) in class_pairs(triples, seed).items()}


def choose_tau(same: np.ndarray, different: np.ndarray, grid: np.ndarray | None = None) -> tuple[float, float]:
    """(tau, balanced accuracy): the threshold on d that best separates pairs that should
    score 1 (`same`, d < tau) from those that should score 0 (`different`)."""
    grid = np.round(np.arange(0.01, 0.6, 0.01), 2) if grid is None else grid
    scores = [(0.5 * (np.mean(same < t) + np.mean(different >= t)), -t) for t in grid]
    best, neg_t = max(scores)
    return float(-neg_t), float(best)


def summary(d: np.ndarray) -> dict[str, float]:
    q = np.quantile(d, [0.05, 0.25, 0.5, 0.75, 0.95]) if len(d) else [float("nan")] * 5
    return {"n": float(len(d)), "p05": float(q[0]), "p25": float(q[1]), "median": float(q[2]),
            "p75": float(q[3]), "p95": float(q[4])}


# ----------------------------------------------------------------------------- near misses

_NUMBERED = re.compile(r"\b([a-z]+) (\d+)\b")
_FLIPS = [("is open", "is closed"), ("You open", "You close"), ("turn on", "turn off"), ("is on", "is off")]


def _flip_state(text: str, rng) -> str | None:
    for a, b in _FLIPS:
        if a in text:
            return text.replace(a, b, 1)
        if b in text:
            return text.replace(b, a, 1)
    return None


def _items(text: str) -> tuple[re.Match, list[str]] | None:
    m = _LIST.search(text)
    if not m or m.group(2) == "nothing":
        return None
    return m, re.split(r", and |, | and ", m.group(2))


def _with_items(text: str, m: re.Match, items: list[str]) -> str:
    listed = "nothing" if not items else items[0] if len(items) == 1 else ", ".join(items[:-1]) + ", and " + items[-1]
    return text[: m.start(2)] + listed + text[m.end(2):]


def _drop_item(text: str, rng) -> str | None:
    found = _items(text)
    if not found:
        return None
    m, items = found
    del items[rng.integers(len(items))]
    return _with_items(text, m, items)


def _add_item(text: str, rng, pool: Sequence[str]) -> str | None:
    found = _items(text)
    if not found:
        return None
    m, items = found
    extra = [p for p in pool if p not in items]
    if not extra:
        return None
    items.insert(int(rng.integers(len(items) + 1)), extra[rng.integers(len(extra))])
    return _with_items(text, m, items)


def _object_number(text: str, rng) -> str | None:
    """One numbered object ("apple 2") renumbered everywhere it is named (a wrong object id)."""
    names = sorted(set(_NUMBERED.findall(text)))
    if not names:
        return None
    name, num = names[rng.integers(len(names))]
    other = str(int(num) + 1 + int(rng.integers(3)))
    return re.sub(rf"\b{name} {num}\b", f"{name} {other}", text)


def _receptacle(text: str, rng, pool: Sequence[str]) -> str | None:
    """The place arrived at swapped for another receptacle of the game."""
    m = re.match(r"You arrive at ([a-z]+ \d+)\.", text)
    if not m:
        return None
    others = [p for p in pool if p != m.group(1)]
    if not others:
        return None
    new = others[rng.integers(len(others))]
    return text.replace(m.group(1), new)


def _json_change(text: str, rng, key_filter: Callable[[str], bool]) -> str | None:
    """tau2: one leaf of a JSON state (bare, or a `<tool_response>` block) changed (a string,
    a number, an id, a status)."""
    return tool_states.change_json_leaf(text, lambda n: int(rng.integers(n)), key_filter)


def near_misses(triples: Sequence[Triple], seed: int = 0) -> dict[str, tuple[list[str], list[str]]]:
    """kind -> (real next states, the same states with one fact wrong), from real transitions.
    "other_action": the real next state of a different action from the same observation."""
    rng = np.random.default_rng(seed)
    items = sorted({i for t in triples for i in (_items(t.next_state) or (None, []))[1]})
    places = sorted({m.group(1) for t in triples for m in [re.match(r"You arrive at ([a-z]+ \d+)\.", t.next_state)] if m})
    makers = {"flip_state": _flip_state, "drop_item": _drop_item,
              "add_item": lambda x, r: _add_item(x, r, items), "object_number": _object_number,
              "receptacle": lambda x, r: _receptacle(x, r, places),
              "json_value": lambda x, r: _json_change(x, r, lambda k: not k.endswith("id") and "status" not in k),
              "json_id": lambda x, r: _json_change(x, r, lambda k: k.endswith("id")),
              "json_status": lambda x, r: _json_change(x, r, lambda k: "status" in k),
              "tool_text": lambda x, r: tool_states.change_text(x, lambda n: int(r.integers(n)))}
    out: dict[str, tuple[list[str], list[str]]] = {k: ([], []) for k in [*makers, "other_action"]}
    seen = set()
    for t in triples:
        if t.next_state in seen:
            continue
        seen.add(t.next_state)
        for kind, make in makers.items():
            wrong = make(t.next_state, rng)
            if wrong is not None and wrong != t.next_state:
                out[kind][0].append(t.next_state)
                out[kind][1].append(wrong)
    by_obs: dict[tuple, list[Triple]] = {}
    for t in triples:
        by_obs.setdefault((t.task_id, t.observation), []).append(t)
    for group in by_obs.values():
        outcomes = {t.action: t.next_state for t in group}
        if len(set(outcomes.values())) > 1:
            (a1, s1), (a2, s2) = list(outcomes.items())[:2]
            if s1 != s2:
                out["other_action"][0].append(s1)
                out["other_action"][1].append(s2)
    return {k: v for k, v in out.items() if v[0]}


def action_echo(action: str) -> str:
    """A 'prediction' that knows nothing of the world: ALFWorld's phrasing around the action's
    own words ("go to X" -> "You arrive at X. On the X, you see a X."); tau2: a tool call's
    arguments written back as its result (`tool_states.call_echo`)."""
    echo = tool_states.call_echo(action)
    if echo is not None:
        return echo
    words = action.split()
    if action.startswith("go to "):
        x = action[len("go to "):]
        return f"You arrive at {x}. On the {x}, you see a {x}."
    if words[:1] == ["take"] and " from " in action:
        obj, place = action[len("take "):].split(" from ", 1)
        return f"You pick up the {obj} from the {place}."
    if words[:1] in (["put"], ["move"]) and (" in/on " in action or " to " in action):
        obj, place = re.split(r" in/on | to ", action[len(words[0]) + 1:], maxsplit=1)
        return f"You move the {obj} to the {place}."
    if words[:1] == ["open"]:
        x = action[len("open "):]
        return f"You open the {x}. The {x} is open. In it, you see a {x}."
    if words[:1] == ["close"]:
        return f"You close the {action[len('close '):]}."
    return f"You {action}."


def pass_rate(embedder: Embedder, a: Sequence[str], b: Sequence[str], tau: float) -> float:
    """The share of pairs the reward at `tau` scores 1 (d < tau)."""
    return float(np.mean(cosine_distances(embedder, a, b) < tau)) if len(a) else float("nan")


def _passes(d: np.ndarray, pairs: tuple[Sequence[str], Sequence[str]], tau: float, facts: bool) -> np.ndarray:
    ok = d < tau
    if facts:
        ok &= np.asarray([same_facts(a, b) for a, b in zip(*pairs)], bool)
    return ok


def report(embedder: Embedder, triples: Sequence[Triple], seed: int = 0) -> dict[str, dict]:
    """The calibration of one embedder on one env's triples, for both embedding rewards:
    {"embedding": ..., "embedding_facts": ...} (the second: the facts must match too), from
    one set of embedded distances. Each: tau_d for the reward (best balanced accuracy of
    paraphrases against near misses and other states) and for the filter (the distance within
    which 0.9 of the paraphrases fall: a stricter notion of right), and at the reward's tau_d:
    the pass rates of true states (paraphrases), of each near-miss kind and overall, and the
    action-echo template's mean reward."""
    classes_pairs = class_pairs(triples, seed=seed)
    misses = near_misses(triples, seed=seed)
    echo = ([action_echo(t.action) for t in triples], [t.next_state for t in triples])
    d = distances_by_kind(embedder, {**{("class", k): p for k, p in classes_pairs.items()},
                                     **{("miss", k): p for k, p in misses.items()}, ("echo", ""): echo})
    classes = {k: d["class", k] for k in classes_pairs}
    miss_d = {k: d["miss", k] for k in misses}
    echo_d = d["echo", ""]
    return {name: _report_at(classes_pairs, classes, misses, miss_d, echo, echo_d, facts)
            for name, facts in (("embedding", False), ("embedding_facts", True))}


def distances_by_kind(embedder: Embedder, pairs: dict) -> dict:
    """{kind: `cosine_distances` of its pairs}, every kind's texts embedded in one batch: the
    real next states recur in every kind (as paraphrased, as near-missed, as echoed), and one
    batch embeds each text once (a call per kind embedded one up to nine times)."""
    a = [text for first, _ in pairs.values() for text in first]
    b = [text for _, second in pairs.values() for text in second]
    flat = cosine_distances(embedder, a, b)
    ends = np.cumsum([len(first) for first, _ in pairs.values()])
    return dict(zip(pairs, np.split(flat, ends[:-1])))


def _report_at(classes_pairs, classes, misses, miss_d, echo, echo_d, facts: bool) -> dict:
    pairs, positives = classes_pairs["paraphrase"], classes["paraphrase"]
    negatives = np.concatenate([*miss_d.values(), classes["same_game"], classes["other_game"]])
    if facts:  # a negative whose facts differ never passes: only the facts-equal ones constrain tau
        keep = np.concatenate([~np.asarray([same_facts(a, b) for a, b in zip(*misses[k])]) for k in misses])
        negatives = np.concatenate([np.where(keep, np.inf, np.concatenate(list(miss_d.values()))),
                                    classes["same_game"], classes["other_game"]])
    tau, balanced = choose_tau(positives, negatives)
    tau_filter = float(np.quantile(positives, 0.9)) if len(positives) else tau
    by_kind = {k: _passes(d, misses[k], tau, facts) for k, d in miss_d.items()}
    all_miss = np.concatenate(list(by_kind.values())) if by_kind else np.zeros(0, bool)
    return {"tau_d": tau, "filter_tau_d": min(tau_filter, tau), "balanced_accuracy": balanced, "facts": facts,
            "positive_pass_rate": float(np.mean(_passes(positives, pairs, tau, facts))),
            "near_miss_pass_rate": float(np.mean(all_miss)) if all_miss.size else float("nan"),
            "near_miss_pass_rate_by_kind": {k: float(np.mean(v)) for k, v in by_kind.items()},
            "near_misses": {k: len(d) for k, d in miss_d.items()},
            "action_echo_reward": float(np.mean(_passes(echo_d, echo, tau, facts))),
            "distances": {**{k: summary(v) for k, v in classes.items()}, **{k: summary(v) for k, v in miss_d.items()}}}
