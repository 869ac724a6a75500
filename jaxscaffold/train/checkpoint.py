"""Training checkpoints with Orbax: async, keep-N, atomic; arrays restored onto their shardings.

A checkpoint holds the TrainState (parameters, optimizer state, step counters) as sharded
arrays, and a JSON document with everything else needed to continue identically: the RNG
seed position, the data iterator's state, the feedback schedule / bandit state, and
metric history. Orbax writes each step to a temporary directory and renames it when
complete, so a crash mid-save never leaves a half checkpoint that would be restored. A
checkpoint damaged afterwards (a truncated or deleted file) is skipped on resume:
`restore_latest` falls back to the newest one that reads, in one warning line.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
import time
from typing import Any

import jax
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


class CheckpointNotFound(FileNotFoundError):
    """No (complete) checkpoint where one was asked for."""


class CheckpointCorrupt(CheckpointNotFound):
    """Checkpoints exist but none of them reads back."""


def saved_steps(directory: str) -> list[int]:
    """The finished steps under `directory`, without opening Orbax (which would start JAX's
    backend, before a multi-host run has initialised its runtime): Orbax names a finished step's
    directory by its number, an unfinished one carries a suffix."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


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

    def restore_latest(self, target: Any) -> tuple[int, Any, dict]:
        """(step, state, extra) of the newest checkpoint that reads back, onto `target` as in
        `restore`. Newer ones that fail (a truncated or deleted file) are reported in one
        warning line and moved aside to `<directory>.corrupt/<step>` (the resumed run saves
        those steps again). Raises CheckpointNotFound when there is none, CheckpointCorrupt
        (naming each step's error) when none reads."""
        failed: dict[int, str] = {}
        for step in sorted(self._manager.all_steps(), reverse=True):
            try:
                with _quiet_failed_reads():
                    state, extra = self.restore(target, step)
            except Exception as e:  # noqa: BLE001  any failure to read makes the step unusable
                failed[step] = _first_line(e)
                continue
            if failed:
                moved = self._move_aside(sorted(failed))
                log.warning("checkpoint %s in %s unreadable (%s), moved to %s; resuming from step %d, the "
                            "newest intact checkpoint", ", ".join(f"step {k}" for k in sorted(failed)),
                            self.directory, "; ".join(failed[k] for k in sorted(failed)), moved, step)
            return step, state, extra
        if not failed:
            raise CheckpointNotFound(f"no checkpoint in {self.directory}")
        raise CheckpointCorrupt(f"no checkpoint in {self.directory} reads back: "
                                + "; ".join(f"step {k}: {v}" for k, v in sorted(failed.items())))

    def _move_aside(self, steps: list[int]) -> str:
        aside = self.directory + ".corrupt"
        if jax.process_index() == 0:
            os.makedirs(aside, exist_ok=True)
            for step in steps:
                dest, n = os.path.join(aside, str(step)), 1
                while os.path.exists(dest):  # the same step damaged again in a later resume
                    dest, n = os.path.join(aside, f"{step}.{n}"), n + 1
                os.rename(os.path.join(self.directory, str(step)), dest)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices("jaxscaffold: corrupt checkpoints moved aside")
        self._manager.reload()
        return aside

    def read(self, target: Any, step: int) -> tuple[Any, dict]:
        """`restore` of one step for readers (export, evaluation): a step that does not read
        back is one CheckpointCorrupt line naming it and the other steps (nothing is moved)."""
        try:
            with _quiet_failed_reads():
                return self.restore(target, step)
        except CheckpointNotFound:
            raise
        except Exception as e:  # noqa: BLE001  any failure to read makes the step unusable
            others = sorted(set(self._manager.all_steps()) - {step})
            raise CheckpointCorrupt(f"checkpoint step {step} in {self.directory} does not read back ({_first_line(e)}); "
                                    f"other steps: {others or 'none'}") from None

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


def _first_line(e: Exception) -> str:
    """The gist of a read error (TensorStore's messages go on with the whole array spec)."""
    text = str(e).strip().split(" See full TensorStore details")[0].splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


@contextlib.contextmanager
def _quiet_failed_reads():
    """Silences what a failed read leaves behind: TensorStore's pending reads of the other
    arrays fail after Orbax's event loop closed, and Python prints each as an "Exception
    ignored" traceback (hundreds of lines for one truncated file). The read's own error is
    raised as usual."""
    hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: None
    try:
        yield
    except Exception:
        time.sleep(1.0)  # the other reads finish on TensorStore's threads (a rare path: worth a second)
        raise
    finally:
        gc.collect()  # the abandoned coroutines are finalised here, inside the quiet window
        sys.unraisablehook = hook


def _abstract(x):
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    return x
