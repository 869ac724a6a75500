"""A save that cannot complete stops the run at once and loses nothing already saved: free
space is checked before each save; an asynchronous write's I/O error is collected by the next
`check()` as one line naming the last complete checkpoint; the next start removes the partial
save and restores that checkpoint."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

from jaxscaffold.train import checkpoint as checkpoint_lib
from jaxscaffold.train.checkpoint import Checkpointer, CheckpointSaveError, saved_steps

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def state(value: float, rows: int = 64):
    return {"w": jnp.full((rows, 256), value, jnp.float32)}


def test_too_little_free_space_refuses_the_save(tmp_path, monkeypatch):
    ckpt = Checkpointer(str(tmp_path / "ckpt"))
    ckpt.save(1, state(1.0), {"step": 1})
    ckpt.wait()
    size = sum(p.stat().st_size for p in (tmp_path / "ckpt" / "1").rglob("*") if p.is_file())
    real = checkpoint_lib.shutil.disk_usage
    monkeypatch.setattr(checkpoint_lib.shutil, "disk_usage",
                        lambda path: real(path)._replace(free=size))  # less than the last save and its margin
    with pytest.raises(CheckpointSaveError, match=r"checkpoint step 2 not saved: [\d.]+ MB free in .*a save takes "
                                                  r"about [\d.]+ MB .*last complete checkpoint: step 1 in ") as e:
        ckpt.save(2, state(2.0), {"step": 2})
    assert "\n" not in str(e.value)
    with pytest.raises(CheckpointSaveError):  # the run is over: every later call says so
        ckpt.check()
    ckpt.close()
    assert saved_steps(str(tmp_path / "ckpt")) == [1]


def test_a_failed_start_of_a_save_is_one_line(tmp_path, monkeypatch):
    ckpt = Checkpointer(str(tmp_path / "ckpt"), async_save=False)
    ckpt.save(1, state(1.0), {"step": 1})

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(ckpt._manager, "save", no_space)
    with pytest.raises(CheckpointSaveError, match=r"step 2 not saved: OSError: \[Errno 28\] No space left on device; "
                                                  r"last complete checkpoint: step 1"):
        ckpt.save(2, state(2.0), {"step": 2})
    ckpt.close()


SCRIPT = textwrap.dedent("""
    import resource, signal, sys, time
    import jax, jax.numpy as jnp
    from jaxscaffold.train.checkpoint import Checkpointer, CheckpointSaveError
    ckpt = Checkpointer(sys.argv[1])
    ckpt.save(1, {"w": jnp.full((64, 256), 1.0)}, {"step": 1})
    ckpt.wait()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
    w = jax.random.normal(jax.random.key(0), (4096, 256))  # 4 MB that do not compress
    ckpt.save(2, {"w": w}, {"step": 2})  # its write fails in the background
    for _ in range(600):  # what the trainer does before each step: collect the error, not wait
        try:
            ckpt.check()
        except CheckpointSaveError as e:
            print("ERROR", e)
            break
        time.sleep(0.1)
    ckpt.close()
""")


def test_an_asynchronous_write_error_is_collected_and_the_last_checkpoint_restores(tmp_path):
    directory = tmp_path / "ckpt"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(directory)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [line] = [x for x in proc.stdout.splitlines() if x.startswith("ERROR")]
    assert line.startswith("ERROR checkpoint step 2 not saved: File too large (errno 27); last complete checkpoint: "
                           "step 1 in "), line
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert saved_steps(str(directory)) == [1]
    ckpt = Checkpointer(str(directory), cleanup_partial=True)  # the run starts again: the partial save is removed
    step, restored, extra = ckpt.restore_latest(state(0.0))
    assert (step, extra) == (1, {"step": 1})
    np.testing.assert_array_equal(restored["w"], np.ones((64, 256)))
    assert sorted(os.listdir(directory)) == ["1"]
    ckpt.close()


def test_the_run_stops_at_the_failed_save_and_resumes_after_space_is_freed(tmp_path, monkeypatch):
    """The trainer: the disk fills after step 1's save; step 2's save is refused, the run stops
    with the error naming step 1 (nothing after it is lost but the step itself); once space is
    free the same command resumes from step 1 and finishes."""
    from jaxscaffold.train.trainer import train
    from tests.train.configs import tiny_config
    real, calls = checkpoint_lib.shutil.disk_usage, []

    def filling(path):
        calls.append(path)
        return real(path) if len(calls) == 1 else real(path)._replace(free=0)
    monkeypatch.setattr(checkpoint_lib.shutil, "disk_usage", filling)
    cfg = tiny_config(tmp_path, steps=3, words=True, **{"eval.every": 0, "checkpoint.every": 1})  # the word vocabulary: saves, not tokens
    with pytest.raises(CheckpointSaveError, match=r"^checkpoint step 2 not saved: 0\.0 MB free .*; last complete "
                                                  r"checkpoint: step 1 in ") as e:
        train(cfg)
    assert "\n" not in str(e.value)
    assert saved_steps(str(tmp_path / "checkpoints")) == [1]
    monkeypatch.undo()
    out = train(cfg)
    assert [h["step"] for h in out["history"]] == [1, 2, 3]
    assert saved_steps(str(tmp_path / "checkpoints")) == [1, 2, 3]
