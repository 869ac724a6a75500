"""The protocol every workload follows, and the registry the trainer chooses one from by
`cfg.job`; the trainer (`train.trainer.train`) sees only this."""

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

    # Optional, where a workload needs them (the trainer checks with hasattr):
    # - `total_steps(configured: int) -> int`: the run's length when the workload derives it
    #   from its data (RWML's epochs over the filtered triples); else `cfg.steps`.
    # - `train_on(job, state, episodes) -> (state, train_metrics)`: the update of a step when
    #   it is not the RL one (`train.update.train_on`): SFT's cross-entropy step.
    # - `hand_off_dir() -> str`: where the final parameters are exported (HF) at the end of
    #   the run, for the stage that follows (RWML's stage 1 -> stage 2).
    # - `partial_rollouts = True` with `collect(job, params, step, refresh_params=None)`: its
    #   agents take newer weights between decode chunks (`rollout.partial`, `train.collector`).
    # - `collects_off_main_thread = True`: `collect` issues no device collective but through
    #   `multihost.allgather_json` and `sampler_params`, so on several processes it may run in
    #   the collector's thread (`rollout.max_staleness > 0`; the trainer refuses the others).


WorkloadFactory = Callable[[Job, Any], Workload]

# job name -> its workload; each workload module registers its own (`register_workload`).
WORKLOADS: dict[str, WorkloadFactory] = {}


def register_workload(name: str) -> Callable[[WorkloadFactory], WorkloadFactory]:
    """Class decorator: `name`'s runs (`workload_name(cfg)`) use this workload."""
    def add(factory: WorkloadFactory) -> WorkloadFactory:
        WORKLOADS[name] = factory
        return factory
    return add


def workload_name(cfg) -> str:
    """The workload a config runs: `cfg.job` (rl, rwml, sft), and for RWML's stage 1 with
    `rwml.objective = "sft"` the WM-SFT baseline, "wm_sft"."""
    if cfg.job == "rwml" and cfg.rwml is not None and cfg.rwml.objective == "sft":
        return "wm_sft"
    return cfg.job


def registered() -> dict[str, WorkloadFactory]:
    """Every registered workload by name, the built-in ones (rl, rwml, wm_sft, sft) included."""
    # The built-in workloads register themselves when their modules are imported.
    from jaxscaffold.train.workloads import env_rl, sft, world_model  # noqa: F401
    return dict(WORKLOADS)


def workload_for(cfg) -> WorkloadFactory:
    """The registered workload of `cfg` (see `workload_name`)."""
    name, known = workload_name(cfg), registered()
    if name not in known:
        raise ValueError(f"no workload {name!r} (config.job); registered: {', '.join(sorted(known))}")
    return known[name]
