"""The protocol every workload follows; the trainer (`train.trainer.train`) sees only this."""

from __future__ import annotations

from typing import Any, Callable, Protocol

from jaxscaffold.train.job import Job
from jaxscaffold.episodes.episode import Episode


class Workload(Protocol):
    """What a training step trains on and how the model is evaluated.

    Built as `workload(job, initial_params)`. Its state (task stream position, a learned
    schedule's posterior, ...) is JSON and lives in the checkpoints. On several processes every
    method is called on every process, in the same order (they may gather across processes)."""

    def collect(self, job: Job, params, step: int) -> tuple[list[Episode], dict[str, float]]:
        """This process's episodes to train on at `step` (whole groups), and the step's metrics."""

    def evaluate(self, job: Job, params, step: int) -> dict[str, float]:
        """The `eval/` metrics of `params` (the same on every process)."""

    def get_state(self) -> dict:
        """What resuming needs, JSON-serialisable."""

    def set_state(self, state: dict) -> None:
        """Restores `get_state`'s output."""

    def close(self) -> None:
        """Releases what the workload holds (environment workers)."""

    # Optional: `total_steps(configured: int) -> int`, the run's length when the workload
    # derives it from its data (RWML's epochs over the filtered triples); else `cfg.steps`.
    # Optional: `partial_rollouts = True` with `collect(job, params, step, refresh_params=None)`:
    # its agents take newer weights between decode chunks (`rollout.partial`, `train.collector`).


WorkloadFactory = Callable[[Job, Any], Workload]
