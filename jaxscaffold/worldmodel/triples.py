"""Trajectories -> world-model triples (history up to t, action a_t, next observation s_t+1)."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
from typing import Iterable, Sequence


@dataclasses.dataclass(frozen=True)
class Triple:
    """One transition with everything before it.

    `history` holds the (observation, action) pairs of the steps before t; `observation`
    is s_t, `action` a_t, `next_state` s_t+1 (the env's own text, without feedback);
    `category` the task's (`Task.category`: tau2's domain, ALFWorld's task type), for metrics.
    """

    env: str
    task_id: str
    history: tuple[tuple[str, str], ...]
    observation: str
    action: str
    next_state: str
    category: str = ""  # (a default: triples saved before it load)

    def key(self) -> str:
        """Identity for deduplication: the same transition after the same history (the
        category follows from the task, so it is not part of it)."""
        blob = json.dumps([self.env, self.task_id, self.history, self.observation, self.action, self.next_state])
        return hashlib.sha1(blob.encode()).hexdigest()

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Triple":
        return cls(d["env"], d["task_id"], tuple((o, a) for o, a in d["history"]), d["observation"],
                   d["action"], d["next_state"], d.get("category", ""))


def from_trajectory(env: str, task_id: str, observations: Sequence[str], actions: Sequence[str],
                    category: str = "") -> list[Triple]:
    """observations o_0..o_n and actions a_0..a_n-1 (o_k+1 answers a_k) -> n triples.

    A trajectory cut short (an infrastructure failure) has fewer observations than actions;
    only transitions whose next observation exists become triples.
    """
    n = min(len(actions), len(observations) - 1)
    out = []
    for t in range(n):
        history = tuple(zip(observations[:t], actions[:t]))
        out.append(Triple(env, task_id, history, observations[t], actions[t], observations[t + 1], category))
    return out


def dedupe(triples: Iterable[Triple]) -> list[Triple]:
    """First occurrence of each transition kept, order preserved (G rollouts of one task often
    share their first steps)."""
    seen, out = set(), []
    for t in triples:
        k = t.key()
        if k not in seen:
            seen.add(k)
            out.append(t)
    return out


def statistics(raw: Sequence[Triple], unique: Sequence[Triple]) -> dict[str, float]:
    """Counts worth logging: duplicates removed, history depth, how often nothing changes."""
    out = {"triples/raw": float(len(raw)), "triples/unique": float(len(unique)),
           "triples/duplicate_share": 1.0 - len(unique) / max(len(raw), 1)}
    if unique:
        out["triples/mean_history_steps"] = sum(len(t.history) for t in unique) / len(unique)
        out["triples/unchanged_share"] = sum(t.next_state == t.observation for t in unique) / len(unique)
        common = collections.Counter(t.next_state for t in unique).most_common(1)[0]
        out["triples/most_common_next_state_share"] = common[1] / len(unique)
        for env, n in collections.Counter(t.env for t in unique).items():
            out[f"triples/{env}"] = float(n)
    return out


def save(path: str, triples: Sequence[Triple], **columns: Sequence) -> None:
    """JSON lines, one triple per line (plus per-triple columns such as a split or a flag)."""
    with open(path, "w") as f:
        for i, t in enumerate(triples):
            f.write(json.dumps({**t.to_json(), **{k: v[i] for k, v in columns.items()}}) + "\n")


def load(path: str) -> tuple[list[Triple], list[dict]]:
    """(triples, the other columns of each line)."""
    triples, extra = [], []
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            triples.append(Triple.from_json(d))
            extra.append({k: v for k, v in d.items() if k not in Triple.__dataclass_fields__})
    return triples, extra
