"""Training checkpoints with Orbax: async, keep-N, atomic; arrays restored onto their shardings.

A checkpoint holds the TrainState (parameters, optimizer state, step counters) as sharded
arrays, and a JSON document with everything else needed to continue identically: the RNG
seed position, the data iterator's state, the feedback schedule / bandit state, and
metric history. Orbax writes each step to a temporary directory and renames it when
complete, so a crash mid-save never leaves a half checkpoint that would be restored.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


class CheckpointNotFound(FileNotFoundError):
    """No (complete) checkpoint where one was asked for."""


class Checkpointer:
    """Saves and restores (train_state, extra_json) pairs under `directory/<step>`."""

    def __init__(self, directory: str, *, keep: int = 3, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save,
                                               create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def save(self, step: int, state: Any, extra: dict) -> None:
        """Starts saving (returns before the write finishes when async)."""
        self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                         extra=ocp.args.JsonSave(extra)))

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict]:
        """Restores onto `target`'s structure, dtypes and shardings (a state or its
        `jax.eval_shape` with shardings). Raises CheckpointNotFound when there is none."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointNotFound(f"no checkpoint in {self.directory}")
        if step not in self._manager.all_steps():
            raise CheckpointNotFound(f"no checkpoint for step {step} in {self.directory} "
                                     f"(have {sorted(self._manager.all_steps())})")
        abstract = jax.tree.map(_abstract, target)
        out = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                                  extra=ocp.args.JsonRestore()))
        log.info("restored checkpoint step %d from %s", step, self.directory)
        return out["state"], out["extra"]

    def restore_extra(self, step: int | None = None) -> dict:
        """Only the JSON document of a checkpoint (e.g. its run config)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointNotFound(f"no checkpoint in {self.directory}")
        return self._manager.restore(step, args=ocp.args.Composite(extra=ocp.args.JsonRestore()))["extra"]

    def wait(self) -> None:
        """Blocks until pending async saves are on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def _abstract(x):
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    return x
