"""Calibrating tau_d for an embedder on real transitions: how far paraphrases of a next state
land from it, against other states of the same game and of other games.

The paper's thresholds (ALFWorld 0.1 / 0.2) were set for Qwen3-Embedding-8B; a different
embedder spreads distances differently, so `launch/rwml_calibrate.py` measures the classes
below on real ALFWorld triples and picks the threshold that separates them best.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from jaxscaffold.worldmodel.embedders import Embedder
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
    """Items reordered, then phrases swapped for synonyms: the same state in other words."""
    out = reorder_items(text, rng)
    for a, b in SYNONYMS:
        out = out.replace(a, b)
    return out


def distance_classes(embedder: Embedder, triples: Sequence[Triple], seed: int = 0) -> dict[str, np.ndarray]:
    """Distances from each distinct next state to: its paraphrase ("paraphrase", should pass);
    another next state of the same game ("same_game", usually another receptacle or object);
    a next state of another game ("other_game")."""
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
    return {k: cosine_distances(embedder, a, b) for k, (a, b) in pairs.items()}


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
