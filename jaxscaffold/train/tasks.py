"""Where a run's tasks come from: the `config.envs` task specs and the training task stream.

A task spec is comma-separated entries "env", "env:split" (another split than the default) or
"env:split:n" (the first n tasks; the split may be empty, "env::n"), e.g.
"sciworld:train:4,bfcl:validation".

Evaluation sets (`load_eval_tasks`) are balanced instead: an entry's n tasks are spread evenly
over its tasks' categories (`Task.category`: ScienceWorld task types, BFCL categories), drawn
with a seed, so a small set still covers every category.
"""

from __future__ import annotations

import zlib
from collections import Counter
from typing import Sequence

import grain
import numpy as np

from jaxscaffold.envs import registry
from jaxscaffold.envs.base import Task
from jaxscaffold.envs.registry import TaskSpec, parse_task_spec  # noqa: F401  (re-exported)


class TaskSourceError(ValueError):
    """A task spec whose catalogue cannot be read (a missing split file or JSONL file, an env's
    missing dependency): the message names the entry."""


def catalogue(env: str, split: str) -> list[Task]:
    """`registry.catalogue`, its failures as one-line TaskSourceErrors naming the entry."""
    try:
        return registry.catalogue(env, split)
    except (ValueError, KeyError, OSError, ImportError) as e:
        raise TaskSourceError(f"tasks {env}:{split}: {str(e).strip(chr(39) + chr(34))}") from e


def env_names(spec: str) -> list[str]:
    """"sciworld,bfcl:validation" -> ["sciworld", "bfcl"]."""
    return [s.env for s in parse_task_spec(spec)]


def load_tasks(spec: str, split: str, limit: int | None = None) -> list[Task]:
    """The tasks of every entry of `spec`, in order: its split's catalogue (`split` unless the
    entry names one), its first n tasks (the entry's n, else `limit`; none: all)."""
    out = []
    for s in parse_task_spec(spec):
        cat = catalogue(s.env, s.split or split)
        n = s.limit if s.limit is not None else limit
        out += cat[:n] if n else cat
    return out


def category_counts(available: dict[str, int], n: int, rng: np.random.Generator) -> dict[str, int]:
    """How many of `n` tasks each category gets: the same count for all (all of a category that
    has fewer), the remainder one more each for categories in a seeded order; every task when
    `n` is at least their total."""
    if n >= sum(available.values()):
        return dict(available)
    # The level: the largest equal count that fits (categories with fewer give all they have).
    level = 0
    while sum(min(c, level + 1) for c in available.values()) <= n:
        level += 1
    counts = {k: min(c, level) for k, c in available.items()}
    spare = sorted(k for k, c in available.items() if c > level)  # sorted: the rng alone orders them
    for k in rng.permutation(spare)[: n - sum(counts.values())]:
        counts[str(k)] += 1
    return counts


def balanced(tasks: Sequence[Task], n: int | None, seed: int | Sequence[int]) -> list[Task]:
    """`n` of `tasks` spread over their categories (`category_counts`), a seeded sample within
    each, in catalogue order; all of them when `n` is None or not below their number."""
    if n is None or n >= len(tasks):
        return list(tasks)
    rng = np.random.default_rng(seed)
    by_category: dict[str, list[int]] = {}
    for i, t in enumerate(tasks):
        by_category.setdefault(t.category, []).append(i)
    counts = category_counts({k: len(v) for k, v in by_category.items()}, n, rng)
    chosen = [int(i) for k in sorted(by_category)
              for i in rng.choice(by_category[k], size=counts[k], replace=False)]
    return [tasks[i] for i in sorted(chosen)]


def load_eval_tasks(spec: str, split: str, limit: int, seed: int) -> list[Task]:
    """The evaluation set of `spec`: each entry's split (`split` unless it names one), its n
    tasks (the entry's n, capped at `limit`; 0 / none: all of the split), balanced over its
    categories (`balanced`). `seed` (a run's `seeds.derive(seed, "eval_tasks")`) with the
    entry's env and split seeds each entry's draw, so adding an env leaves the others' sets.
    (The reference code draws its 128 ScienceWorld tasks uniformly from L0 test, in the split's
    proportions, a fifth of them one task type; balanced sets weigh every type alike instead.)"""
    out = []
    for s in parse_task_spec(spec):
        name = s.split or split
        cat = catalogue(s.env, name)
        caps = [c for c in (s.limit, limit) if c]
        out += balanced(cat, min(caps) if caps else None, seed=[seed, zlib.crc32(f"{s.env}:{name}".encode())])
    return out


def describe_tasks(tasks: Sequence[Task]) -> str:
    """What a task set covers: "sciworld 128 tasks (29 categories), bfcl 400 tasks (4 categories)"."""
    per_env = Counter(t.env for t in tasks)
    cats = {env: {t.category for t in tasks if t.env == env} - {""} for env in per_env}
    return ", ".join(f"{env} {n} tasks ({len(cats[env])} categories)" for env, n in per_env.items())


class TaskStream:
    """An endless, shuffled, checkpointable stream of tasks (grain) over several envs."""

    def __init__(self, tasks: list, seed: int):
        if not tasks:
            raise ValueError("no training tasks: check config.envs")
        self.tasks = tasks
        index = grain.MapDataset.range(len(tasks)).shuffle(seed=seed).repeat(None)
        # Indices need no read-ahead: grain's default prefetches 500 of them on 16 threads,
        # which only contend for the GIL with the rollouts (same order, same state format).
        self._it = iter(index.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))

    def take(self, n: int) -> list:
        return [self.tasks[int(next(self._it))] for _ in range(n)]

    def get_state(self) -> dict:
        return self._it.get_state()

    def set_state(self, state: dict) -> None:
        self._it.set_state(state)
