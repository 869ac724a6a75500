"""Training checkpoints with Orbax: async, keep-N, atomic; arrays restored onto their shardings.

A checkpoint holds the TrainState (parameters, optimizer state, step counters) as sharded
arrays (a params-only checkpoint: `{"params": ...}` alone), and a JSON document with everything else needed to continue identically: the RNG
seed position, the data iterator's state, the feedback schedule / bandit state, and
metric history. Orbax writes each step to a temporary directory and renames it when
complete, so a crash mid-save never leaves a half checkpoint that would be restored. A
checkpoint damaged afterwards (a truncated or deleted file) is skipped on resume:
`restore_latest` falls back to the newest one that reads, in one warning line.

Damage that still reads is caught too: once a save is complete its files' SHA-256 go into a
manifest in the step's directory (MANIFEST), which a restore verifies (a flipped bit is a
mismatch), and a restored state must be finite (a per-array reduction on device); either
failure makes the step unusable, like a truncated file. Only finite states are saved. A save
that cannot complete (no free space, an I/O error of the asynchronous write) is a
`CheckpointSaveError` naming the cause and the last complete checkpoint: free space is
checked before each save (the last save's size as the estimate), and the asynchronous write's
error is collected by `check()` (the trainer calls it before every step).

Readers (export, evaluation) never need the optimizer state: `read_params` restores the
parameters alone (Orbax's partial restore), and `arrays` reads any block of a saved array
straight from TensorStore, so an export streams a model of any size through a few
megabytes of host memory. Arrays are stored in chunks of at most CHUNK_BYTES, a stacked
layer parameter one layer per chunk, so reading one layer decodes no more than that layer.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from jaxscaffold.train.failures import RunFailed
from jaxscaffold.train.multihost import allgather_json

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 2**20  # storage chunk size at most (what a reader of one block decodes at once)
PARAMS_DIR = "params"  # a run's params-only checkpoints (checkpoint.params_only_every), beside checkpoints/
MANIFEST = "jaxscaffold_manifest.json"  # in a step's directory: {relative path: sha256} of its files
SPACE_MARGIN = 1.1  # free space wanted before a save, times the estimate


class CheckpointNotFound(FileNotFoundError):
    """No (complete) checkpoint where one was asked for."""


class CheckpointCorrupt(CheckpointNotFound):
    """Checkpoints exist but none of them reads back."""


class CheckpointSaveError(RunFailed):
    """A save did not complete (or was refused): the run stops; its message names the cause
    and the last complete checkpoint."""


def saved_steps(directory: str) -> list[int]:
    """The finished steps under `directory`, without opening Orbax (which would start JAX's
    backend, before a multi-host run has initialised its runtime): Orbax names a finished step's
    directory by its number, an unfinished one carries a suffix."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


def find_params(path: str, step: int | None = None) -> tuple[str, int]:
    """(directory, step) of a run's saved parameters at `step` (default: the newest), from a
    run's out_dir (its full checkpoints/ and its params-only params/; a step in both is read
    from checkpoints/) or one of those directories. CheckpointNotFound names what there is."""
    name = os.path.basename(os.path.normpath(path))
    dirs = [path] if name in ("checkpoints", PARAMS_DIR) else [os.path.join(path, "checkpoints"),
                                                                os.path.join(path, PARAMS_DIR)]
    if not any(os.path.isdir(d) for d in dirs):
        raise CheckpointNotFound(f"no checkpoint directory at {path} (expected a run's out_dir, or its "
                                 f"checkpoints/ or {PARAMS_DIR}/)")
    found = {s: d for d in reversed(dirs) for s in saved_steps(d)}  # checkpoints/ last: it wins a tie
    if not found:
        raise CheckpointNotFound(f"no checkpoint in {' or '.join(d for d in dirs if os.path.isdir(d))}")
    if step is None:
        step = max(found)
    if step not in found:
        raise CheckpointNotFound(f"no checkpoint for step {step} in {path} (have {sorted(found)})")
    return os.path.abspath(found[step]), step


class Checkpointer:
    """Saves and restores (train_state, extra_json) pairs under `directory/<step>` (the newest
    `keep`; None: all)."""

    def __init__(self, directory: str, *, keep: int | None = 3, async_save: bool = True,
                 chunk_bytes: int = CHUNK_BYTES, reader: bool = False, cleanup_partial: bool = False):
        """`reader`: this process alone reads an existing directory (export, evaluation): no
        directory is created and no barrier waits for the other processes of a pod, which
        never reach it when one process exports at the end of a run. `cleanup_partial`: the
        run that owns the directory starts: what an interrupted save left is removed (never
        from another process's view of a live run: its save in progress looks the same)."""
        self.directory = os.path.abspath(directory)
        self.chunk_bytes = chunk_bytes
        self._async = async_save
        self._writers = 1 if reader else jax.process_count()
        alone = {} if not reader else {"multiprocessing_options": ocp.options.MultiprocessingOptions(
            primary_host=jax.process_index(), active_processes={jax.process_index()})}
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save,
                                               create=not reader, cleanup_tmp_directories=cleanup_partial and not reader,
                                               **alone)
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        logging.getLogger("absl").addFilter(_ORBAX_TRACEBACKS)  # (once: a filter is added once)
        self._unsealed: list[int] = []  # saved steps whose manifest is not written yet
        self._failed: CheckpointSaveError | None = None

    def save(self, step: int, state: Any, extra: dict) -> None:
        """Starts saving (returns before the write finishes when async). Raises
        CheckpointSaveError when the previous save failed, `state` is not finite, the disk
        lacks room for it, or the save cannot start."""
        self.wait()  # the previous save complete (and sealed) first: its error, and its size
        bad = nonfinite_leaves(state)
        if bad:
            raise self._save_error(step, f"the state is not finite ({', '.join(bad[:3])}); refusing to save it")
        self._check_space(step, state)
        try:
            with _quiet_orbax():
                self._manager.save(step, args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state, save_args=_save_args(state, self.chunk_bytes)),
                    extra=ocp.args.JsonSave(extra)))
        except Exception as e:  # noqa: BLE001  any failure to write: the run cannot keep its progress
            raise self._save_error(step, _save_cause(e)) from None
        self._unsealed.append(step)
        if not self._async:
            self.wait()  # complete: sealed now

    def check(self) -> None:
        """Raises CheckpointSaveError when an asynchronous save failed (without waiting for
        one in progress); seals the saves that completed."""
        if self._failed is not None:
            raise self._failed
        if not self._unsealed or self._manager.is_saving_in_progress():
            return
        self.wait()

    def last_complete_step(self) -> int | None:
        """The newest step whose save completed (sealed, or written before this process)."""
        steps = [s for s in self._manager.all_steps() if s not in self._unsealed]
        return max(steps) if steps else None

    def _save_error(self, step: int, cause: str) -> CheckpointSaveError:
        last = self.last_complete_step()
        where = f"step {last} in {self.directory}" if last is not None else f"none in {self.directory}"
        self._failed = CheckpointSaveError(f"checkpoint step {step} not saved: {cause}; last complete checkpoint: "
                                           f"{where}")
        return self._failed

    def _check_space(self, step: int, state: Any) -> None:
        """Refuses a save the disk has no room for: the last save's size (the state's bytes
        for a first save) with a margin."""
        last = self.last_complete_step()
        need = _tree_bytes(os.path.join(self.directory, str(last))) if last is not None else _state_bytes(state)
        free = shutil.disk_usage(self.directory).free
        # Every process decides alike (one refusing alone would leave the others in Orbax's barrier).
        free = min(allgather_json(free)) if self._writers > 1 else free
        if free < need * SPACE_MARGIN:
            estimate = "the last save's size" if last is not None else "the state's size"
            raise self._save_error(step, f"{free / 1e6:,.1f} MB free in {self.directory}, a save takes about "
                                         f"{need / 1e6:,.1f} MB ({estimate}); free space and resume")

    def _seal(self) -> None:
        """Writes the manifest of each completed save (process 0; the files are shared)."""
        steps, self._unsealed = self._unsealed, []
        if jax.process_index() != 0:
            return
        for step in steps:
            directory = os.path.join(self.directory, str(step))
            if os.path.isdir(directory):  # (keep-N may have removed it already)
                write_manifest(directory)

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
        verify_manifest(os.path.join(self.directory, str(step)))
        abstract = jax.tree.map(_abstract, target)
        out = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                                  extra=ocp.args.JsonRestore()))
        bad = nonfinite_leaves(out["state"])
        if bad:
            raise CheckpointDamaged(f"non-finite values in {', '.join(bad[:3])}")
        log.info("restored checkpoint step %d from %s", step, self.directory)
        return out["state"], out["extra"]

    def restore_latest(self, target: Any, required: tuple[str, ...] = ()) -> tuple[int, Any, dict]:
        """(step, state, extra) of the newest checkpoint that reads back, onto `target` as in
        `restore`, whose extra JSON holds the `required` keys. Newer ones that fail (a
        truncated or deleted file, a checksum mismatch, non-finite values, missing keys) are
        reported in one warning line and moved aside to `<directory>.corrupt/<step>` (the
        resumed run saves those steps again). Raises CheckpointNotFound when there is none,
        CheckpointCorrupt (naming each step's error) when none reads."""
        failed: dict[int, str] = {}
        for step in sorted(self._manager.all_steps(), reverse=True):
            try:
                with _quiet_failed_reads():
                    state, extra = self.restore(target, step)
                missing = sorted(set(required) - set(extra if isinstance(extra, dict) else {}))
                if missing:
                    raise CheckpointDamaged(f"its JSON document lacks {missing}")
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
            raise self.read_error(step, e) from None

    def read_params(self, target: Any, step: int) -> Any:
        """The `params` of a step's saved state alone, onto `target`'s structure, dtypes and
        shardings (Orbax's partial restore: the optimizer state is never read). Reads a full or
        a params-only checkpoint; a step that does not read back is one CheckpointCorrupt line
        as in `read` (also for a checksum mismatch or non-finite parameters)."""
        self._check_step(step)
        abstract = jax.tree.map(_abstract, target)
        restore_args = jax.tree.map(lambda a: ocp.ArrayRestoreArgs(sharding=a.sharding, dtype=a.dtype), abstract)
        args = ocp.args.PyTreeRestore(item={"params": abstract}, restore_args={"params": restore_args},
                                      partial_restore=True)
        try:
            verify_manifest(os.path.join(self.directory, str(step)))
            with _quiet_failed_reads():
                params = self._manager.restore(step, args=ocp.args.Composite(state=args))["state"]["params"]
            bad = nonfinite_leaves(params)
            if bad:
                raise CheckpointDamaged(f"non-finite values in {', '.join(bad[:3])}")
            return params
        except Exception as e:  # noqa: BLE001  any failure to read makes the step unusable
            raise self.read_error(step, e) from None

    def arrays(self, step: int, cache_bytes: int = 2 * CHUNK_BYTES) -> SavedArrays:
        """Blocks of a step's saved arrays, read on demand (see SavedArrays)."""
        self._check_step(step)
        return SavedArrays(os.path.join(self.directory, str(step), "state"), lambda e: self.read_error(step, e),
                           cache_bytes=cache_bytes)

    def read_error(self, step: int, e: Exception) -> CheckpointCorrupt:
        """The one-line error of a step that does not read back, naming the other steps."""
        others = sorted(set(self._manager.all_steps()) - {step})
        return CheckpointCorrupt(f"checkpoint step {step} in {self.directory} does not read back ({_first_line(e)}); "
                                 f"other steps: {others or 'none'}")

    def _check_step(self, step: int) -> None:
        if step not in self._manager.all_steps():
            raise CheckpointNotFound(f"no checkpoint for step {step} in {self.directory} "
                                     f"(have {sorted(self._manager.all_steps())})")

    def restore_extra(self, step: int | None = None) -> dict:
        """Only the JSON document of a checkpoint (e.g. its run config)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointNotFound(f"no checkpoint in {self.directory}")
        self._check_step(step)
        try:
            return self._manager.restore(step, args=ocp.args.Composite(extra=ocp.args.JsonRestore()))["extra"]
        except Exception as e:  # noqa: BLE001  an unreadable JSON document: the step is damaged
            raise self.read_error(step, e) from None

    def delete_after(self, step: int) -> list[int]:
        """Deletes the steps after `step` (a resumed run redoes and saves them again)."""
        later = sorted(s for s in self._manager.all_steps() if s > step)
        for s in later:
            self._manager.delete(s)
        return later

    def wait(self) -> None:
        """Blocks until pending async saves are on disk (and sealed); CheckpointSaveError when
        one failed."""
        if self._failed is not None:
            raise self._failed
        try:
            with _quiet_orbax():
                self._manager.wait_until_finished()
                self._manager.check_for_errors()
        except Exception as e:  # noqa: BLE001  the asynchronous write failed
            step = self._unsealed[-1] if self._unsealed else "?"
            self._unsealed = []  # Orbax dropped the failed step
            raise self._save_error(step, _save_cause(e)) from None
        self._seal()

    def close(self) -> None:
        """Waits for pending saves (a failed one was already reported) and closes."""
        try:
            if self._failed is None:
                self.wait()
        finally:
            with _quiet_orbax(), contextlib.suppress(Exception):
                self._manager.close()


class CheckpointDamaged(ValueError):
    """A step's files read but are wrong: a checksum mismatch, non-finite values, missing keys."""


def _file_hashes(directory: str) -> dict[str, str]:
    out = {}
    for base, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(base, name)
            rel = os.path.relpath(path, directory)
            if rel in (MANIFEST, MANIFEST + ".tmp"):
                continue
            with open(path, "rb") as f:
                out[rel] = hashlib.file_digest(f, "sha256").hexdigest()
    return out


def write_manifest(directory: str) -> str:
    """Writes `directory/MANIFEST` ({file: sha256} of the complete step's files), atomically."""
    path = os.path.join(directory, MANIFEST)
    with open(path + ".tmp", "w") as f:
        json.dump(_file_hashes(directory), f, indent=0, sort_keys=True)
    os.replace(path + ".tmp", path)
    return path


def verify_manifest(directory: str) -> None:
    """CheckpointDamaged when a file of the step differs from its manifest (or is missing). A
    step without a manifest (written before them, or killed before its seal) is not checked."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        log.debug("%s has no %s: its files are not verified", directory, MANIFEST)
        return
    try:
        with open(path) as f:
            expected = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointDamaged(f"unreadable {MANIFEST} ({e})") from None
    actual = _file_hashes(directory)
    for rel, digest in sorted(expected.items()):
        if rel not in actual:
            raise FileNotFoundError(f"{rel} is missing")
        if actual[rel] != digest:
            raise CheckpointDamaged(f"{rel} does not match its checksum (a changed byte)")


def nonfinite_leaves(tree: Any) -> list[str]:
    """The paths of the floating-point arrays of `tree` that hold a NaN or an infinity (one
    reduction per array on its devices, one transfer of the flags)."""
    leaves = [(jax.tree_util.keystr(path), x) for path, x in jax.tree_util.tree_leaves_with_path(tree)
              if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)]
    if not leaves:
        return []
    flags = jax.device_get(_finite_flags([x for _, x in leaves]))
    return [name for (name, _), ok in zip(leaves, flags) if not ok]


@jax.jit
def _finite_flags(arrays: list) -> jax.Array:
    return jnp.stack([jnp.all(jnp.isfinite(x)) for x in arrays])


def _tree_bytes(directory: str) -> int:
    return sum(os.path.getsize(os.path.join(base, name)) for base, _, files in os.walk(directory) for name in files)


def _state_bytes(state: Any) -> int:
    return sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(state) if hasattr(x, "dtype"))


class _OrbaxTracebacks(logging.Filter):
    """Drops the tracebacks Orbax logs (absl, ERROR) for a failed save, also from its background
    thread: the Checkpointer reports each failure in one line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and f"{os.sep}orbax{os.sep}" in record.pathname)


_ORBAX_TRACEBACKS = _OrbaxTracebacks()


@contextlib.contextmanager
def _quiet_orbax():
    """Orbax logs a failed save's traceback through absl (ERROR) before raising it: the
    caller reports the error in one line instead."""
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        absl.setLevel(level)


def _save_cause(e: Exception) -> str:
    """The gist of a failed write: TensorStore's operating-system error ("No space left on
    device (errno 28)") where it names one, else the first line."""
    found = re.search(r":\s*([^:\[]+?)\s*\[os_error_code='?(\d+)", str(e))
    return f"{found.group(1)} (errno {found.group(2)})" if found else _first_line(e)


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


def _save_args(state: Any, chunk_bytes: int) -> Any:
    """Orbax's options per array: chunks of at most `chunk_bytes`, and under a "layers" key (the
    model's parameters stacked over layers, and their moments) one layer per chunk."""
    def args(path, x):
        if not hasattr(x, "shape"):
            return None
        stacked = len(x.shape) >= 2 and any(getattr(k, "key", getattr(k, "name", None)) == "layers" for k in path)
        return ocp.SaveArgs(chunk_byte_size=chunk_bytes, shard_axes=(0,) if stacked else ())
    return jax.tree_util.tree_map_with_path(args, state)


class SavedArrays:
    """Blocks of one saved step's arrays read straight from TensorStore: `read(path, index)` is
    `saved[path][index]` as a NumPy array (path: the keys, e.g. ("params", "layers", "q");
    index: ints and slices), reading only the storage chunks the block touches. Up to
    `cache_bytes` of decoded chunks are kept, so consecutive blocks of one chunk decode it
    once. A read that fails raises `on_error(e)`."""

    def __init__(self, directory: str, on_error, *, cache_bytes: int = 2 * CHUNK_BYTES):
        self.directory, self._on_error = directory, on_error
        self._open: dict[tuple, Any] = {}
        import tensorstore as ts
        self._ts = ts
        self._context = ts.Context({"cache_pool": {"total_bytes_limit": int(cache_bytes)}})

    def _array(self, path: tuple[str, ...]):
        if path not in self._open:
            ocdbt = os.path.exists(os.path.join(self.directory, "manifest.ocdbt"))
            name = ".".join(path)  # Orbax's name of a nested key
            kvstore = {"driver": "ocdbt", "base": f"file://{self.directory}/", "path": name} if ocdbt \
                else {"driver": "file", "path": os.path.join(self.directory, name)}
            error = None
            for driver in ("zarr", "zarr3"):  # Orbax's default format, then its zarr3 option
                try:
                    # A missing chunk is an error, not zeros (TensorStore's default fills it; Orbax's
                    # own read specs turn that off too).
                    spec = {"driver": driver, "kvstore": kvstore, "recheck_cached_data": False,
                            "recheck_cached_metadata": False, "fill_missing_data_reads": False}
                    self._open[path] = self._ts.open(spec, open=True, read=True, context=self._context).result()
                    break
                except Exception as e:  # noqa: BLE001  the other format, or a missing array
                    error = error or e
            else:
                raise self._on_error(error)
        return self._open[path]

    def shape(self, path: tuple[str, ...]) -> tuple[int, ...]:
        return tuple(self._array(path).shape)

    def read(self, path: tuple[str, ...], index: tuple = ()) -> np.ndarray:
        try:
            return np.asarray(self._array(path)[index].read().result())
        except CheckpointCorrupt:
            raise
        except Exception as e:  # noqa: BLE001  a truncated or missing chunk
            raise self._on_error(e) from None
