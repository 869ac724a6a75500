"""Checkpoint damage that still reads is caught and falls back to the previous step: a flipped
bit (the manifest's checksums), non-finite values, a JSON document without its keys; and a
non-finite state is never saved."""

from __future__ import annotations

import json
import logging

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxscaffold.train.checkpoint import (MANIFEST, CheckpointCorrupt, Checkpointer, CheckpointSaveError,
                                          verify_manifest)


def state(value: float = 1.0):
    return {"w": jnp.full((64, 32), value, jnp.float32), "b": jnp.arange(8, dtype=jnp.float32) * value,
            "n": jnp.asarray(3, jnp.int32)}


def saved(tmp_path, steps=(1, 2), async_save=True):
    ckpt = Checkpointer(str(tmp_path / "ckpt"), async_save=async_save)
    for step in steps:
        ckpt.save(step, state(float(step)), {"step": step})
    ckpt.close()
    return tmp_path / "ckpt"


def _largest_data_file(step_dir):
    return max((p for p in step_dir.rglob("*") if p.is_file() and p.name != MANIFEST), key=lambda p: p.stat().st_size)


def _restore_latest(directory, caplog, **kwargs):
    with caplog.at_level(logging.WARNING, logger="jaxscaffold"):
        return Checkpointer(str(directory)).restore_latest(state(0.0), **kwargs)


def test_each_complete_save_has_a_manifest_of_its_files(tmp_path):
    directory = saved(tmp_path)
    for step in (1, 2):
        manifest = json.loads((directory / str(step) / MANIFEST).read_text())
        files = {str(p.relative_to(directory / str(step))) for p in (directory / str(step)).rglob("*")
                 if p.is_file() and p.name != MANIFEST}
        assert set(manifest) == files and all(len(h) == 64 for h in manifest.values())
        verify_manifest(str(directory / str(step)))


def test_a_flipped_bit_falls_back_to_the_previous_step(tmp_path, caplog):
    """The issue's case: a changed byte in a data file restored silently; now it is a checksum
    mismatch, the step is moved aside in one warning line and the previous one restores."""
    directory = saved(tmp_path)
    path = _largest_data_file(directory / "2")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    step, restored, extra = _restore_latest(directory, caplog)
    assert step == 1 and extra == {"step": 1}
    np.testing.assert_array_equal(restored["w"], np.full((64, 32), 1.0))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "does not match its checksum" in warnings[0] and "\n" not in warnings[0]
    assert (tmp_path / "ckpt.corrupt" / "2").is_dir()


def test_a_non_finite_checkpoint_falls_back(tmp_path, caplog):
    """A checkpoint holding NaN (written by an older version, or by hand; its manifest matches)
    is refused on restore like damage."""
    directory = saved(tmp_path, steps=(1,))
    ckpt = Checkpointer(str(directory), async_save=False)
    bad = state(2.0)
    bad["b"] = bad["b"].at[3].set(jnp.nan)
    # Written with Orbax itself: the Checkpointer refuses to save it (the last test).
    ckpt._manager.save(2, args=ocp.args.Composite(state=ocp.args.StandardSave(bad), extra=ocp.args.JsonSave({"step": 2})))
    ckpt.close()
    step, _, _ = _restore_latest(directory, caplog)
    assert step == 1
    assert any("non-finite values in ['b']" in r.getMessage() for r in caplog.records)


def test_missing_keys_fall_back(tmp_path, caplog):
    directory = saved(tmp_path)
    step, _, extra = _restore_latest(directory, caplog, required=("step",))
    assert step == 2
    ckpt = Checkpointer(str(directory), async_save=False)
    ckpt.save(3, state(3.0), {"history": []})
    ckpt.close()
    step, _, extra = _restore_latest(directory, caplog, required=("step",))
    assert step == 2 and extra == {"step": 2}
    assert any("lacks ['step']" in r.getMessage() for r in caplog.records)


def test_a_non_finite_state_is_not_saved(tmp_path):
    directory = saved(tmp_path, steps=(1,))
    ckpt = Checkpointer(str(directory))
    bad = state(2.0)
    bad["w"] = bad["w"] * jnp.inf
    with pytest.raises(CheckpointSaveError, match=r"checkpoint step 2 not saved: the state is not finite \(\['w'\]\).*"
                                                  r"last complete checkpoint: step 1") as e:
        ckpt.save(2, bad, {"step": 2})
    assert "\n" not in str(e.value)
    ckpt.close()
    assert sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) == [1]


def test_no_checkpoint_reads_back_is_one_line(tmp_path):
    directory = saved(tmp_path, steps=(1,))
    path = _largest_data_file(directory / "1")
    data = path.read_bytes()
    path.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])
    with pytest.raises(CheckpointCorrupt, match="step 1: CheckpointDamaged") as e:
        Checkpointer(str(directory)).restore_latest(state(0.0))
    assert "\n" not in str(e.value)


def test_reading_the_parameters_alone_verifies_them_too(tmp_path):
    """Export and evaluation read a step's parameters alone: damage there is one line too."""
    ckpt = Checkpointer(str(tmp_path / "ckpt"), async_save=False)
    ckpt.save(1, {"params": state(1.0)}, {"step": 1})
    ckpt.close()
    reader = Checkpointer(str(tmp_path / "ckpt"), reader=True)
    np.testing.assert_array_equal(reader.read_params(state(0.0), 1)["w"], np.ones((64, 32)))
    path = _largest_data_file(tmp_path / "ckpt" / "1")
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorrupt, match=r"checkpoint step 1 in .* does not read back \(CheckpointDamaged: "
                                                r".* does not match its checksum") as e:
        reader.read_params(state(0.0), 1)
    assert "\n" not in str(e.value)
    reader.close()
