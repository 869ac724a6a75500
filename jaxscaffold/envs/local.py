"""Environments in this process, one instance per episode (tests, tiny runs): the `EnvBatch`
contract of `jaxscaffold.envs.pool.EnvPool`, without worker processes.

Errors are handled as the pool's workers handle them: an env that raises (any exception)
fails its episode with `EpisodeFailure(reason="<type>: <message>", kind="error")`, that env
is closed and dropped, and the episode's later steps return the same failure. There is no
timeout or crash recovery: an env that hangs or kills the process takes the run with it.
"""

from __future__ import annotations

import logging
from typing import Callable, Mapping, Sequence

from jaxscaffold.envs.base import Env, EpisodeFailure, Observation, StepResult, Task

log = logging.getLogger(__name__)


class LocalEnvs:
    """`factories`: env name -> a no-argument constructor (e.g. `registry.factory(name)`)."""

    def __init__(self, factories: Mapping[str, Callable[[], Env]]):
        self.factories = dict(factories)
        self.envs: list[Env | None] = []
        self.tasks: list[Task] = []
        self.failures: dict[int, EpisodeFailure] = {}
        self.finished: set[int] = set()

    def reset(self, tasks: Sequence[Task]) -> list[Observation | EpisodeFailure]:
        """Start one episode per task (episode index = position in `tasks`)."""
        self.close()
        self.tasks, self.envs = list(tasks), []
        out: list[Observation | EpisodeFailure] = []
        for i, task in enumerate(tasks):
            try:
                if task.env not in self.factories:
                    raise KeyError(f"no env factory registered for {task.env!r}")
                self.envs.append(self.factories[task.env]())
                out.append(self.envs[i].reset(task))
            except Exception as e:  # noqa: BLE001  (as the pool: any env error fails the episode)
                if len(self.envs) <= i:
                    self.envs.append(None)
                out.append(self._fail(i, "reset", e))
        return out

    def step(self, actions: Mapping[int, str]) -> dict[int, StepResult | EpisodeFailure]:
        """Step the given episodes with the agent's text. Episodes that already failed get their
        `EpisodeFailure` back; stepping a finished or unknown episode raises ValueError."""
        for i in actions:
            if not (isinstance(i, int) and 0 <= i < len(self.envs)):
                raise ValueError(f"unknown episode index {i!r} (last reset had {len(self.envs)} episodes)")
            if i in self.finished:
                raise ValueError(f"episode {i} is finished; reset before stepping it again")
        out: dict[int, StepResult | EpisodeFailure] = {}
        for i, text in actions.items():
            if i in self.failures:
                out[i] = self.failures[i]
                continue
            try:
                out[i] = self.envs[i].step(text)
            except Exception as e:  # noqa: BLE001
                out[i] = self._fail(i, "step", e)
                continue
            if out[i].done:
                self.finished.add(i)
        return out

    def close(self) -> None:
        for env in self.envs:
            if env is not None:
                env.close()
        self.envs, self.failures, self.finished = [], {}, set()

    def _fail(self, i: int, op: str, e: Exception) -> EpisodeFailure:
        task = self.tasks[i]
        # INFO: a training step reports its failed episodes in one line (`train.failures.StepGuard`).
        log.info("episode %d (%s %s) failed [error] in %s: %s", i, task.env, task.task_id, op, e)
        env, self.envs[i] = self.envs[i], None  # discarded, as the pool does
        if env is not None:
            try:
                env.close()
            except Exception:  # noqa: BLE001  (closing a broken env must not mask its error)
                pass
        self.failures[i] = EpisodeFailure(f"{type(e).__name__}: {e}", "error", i, task)
        return self.failures[i]
