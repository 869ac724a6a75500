"""Where a run's tasks come from: the `config.envs` task specs and the training task stream.

A task spec is comma-separated entries "env", "env:split" (another split than the default) or
"env:split:n" (the first n tasks; the split may be empty, "env::n"), e.g.
"sciworld:train:4,bfcl:validation".
"""

from __future__ import annotations


import grain

from jaxscaffold.envs import registry
from jaxscaffold.envs.base import Task
from jaxscaffold.envs.registry import TaskSpec, parse_task_spec  # noqa: F401  (re-exported)


def env_names(spec: str) -> list[str]:
    """"sciworld,bfcl:validation" -> ["sciworld", "bfcl"]."""
    return [s.env for s in parse_task_spec(spec)]


def load_tasks(spec: str, split: str, limit: int | None = None) -> list[Task]:
    """The tasks of every entry of `spec`, in order: its split's catalogue (`split` unless the
    entry names one), its first n tasks (the entry's n, else `limit`; none: all)."""
    out = []
    for s in parse_task_spec(spec):
        cat = registry.catalogue(s.env, s.split or split)
        n = s.limit if s.limit is not None else limit
        out += cat[:n] if n else cat
    return out


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
