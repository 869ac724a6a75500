"""Orbax checkpoints: sharded round trip, keep-N, extra state, clear errors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxscaffold.models import qwen3
from jaxscaffold.models.config import Qwen3Config
from jaxscaffold.models.sharding import MeshConfig, make_mesh
from jaxscaffold.rl.train_step import init_train_state, state_shardings
from jaxscaffold.train.checkpoint import Checkpointer, CheckpointCorrupt, CheckpointNotFound, saved_steps

CONFIG = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=8)


def test_sharded_round_trip_keep_n_and_extra(tmp_path):
    mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))
    opt = optax.adamw(1e-3)
    sh = state_shardings(CONFIG, opt, mesh)
    state = jax.device_put(init_train_state(qwen3.init_params(CONFIG, jax.random.key(0)), opt), sh)
    ckpt = Checkpointer(str(tmp_path / "ckpt"), keep=2)
    for step in (1, 2, 3):
        state = jax.tree.map(lambda x: x + 1 if jnp.issubdtype(x.dtype, jnp.floating) else x, state)
        ckpt.save(step, state, {"step": step, "bandit": {"alpha": [1.0, 2.0]}, "data": {"position": step * 16}})
    ckpt.wait()
    assert ckpt.latest_step() == 3
    target = jax.device_put(init_train_state(qwen3.init_params(CONFIG, jax.random.key(1)), opt), sh)
    restored, extra = ckpt.restore(target)
    assert extra == {"step": 3, "bandit": {"alpha": [1.0, 2.0]}, "data": {"position": 48}}
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim)
    with pytest.raises(CheckpointNotFound, match="step 1"):
        ckpt.restore(target, step=1)  # kept only the last 2
    ckpt.close()


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "empty"))
    with pytest.raises(CheckpointNotFound, match="no checkpoint"):
        ckpt.restore({"x": jnp.zeros(2)})


def test_restore_latest_when_none_reads_names_every_step_and_moves_nothing(tmp_path):
    """Every checkpoint damaged: a CheckpointCorrupt naming each step's error, no fallback to a
    fresh start, and the damaged steps left where they are (for inspection)."""
    state = {"w": jnp.arange(6.0), "b": jnp.ones(3)}
    ckpt = Checkpointer(str(tmp_path / "ckpt"), async_save=False)
    for step in (1, 2):
        ckpt.save(step, state, {"step": step})
    for step in (1, 2):
        (tmp_path / "ckpt" / str(step) / "extra" / "metadata").unlink()
    with pytest.raises(CheckpointCorrupt, match=r"reads back: step 1: FileNotFoundError.*; step 2: FileNotFoundError"):
        ckpt.restore_latest(state)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.isdigit()) == ["1", "2"]
    assert not (tmp_path / "ckpt.corrupt").exists()
    ckpt.close()
    empty = Checkpointer(str(tmp_path / "empty"))
    with pytest.raises(CheckpointNotFound, match="no checkpoint"):
        empty.restore_latest(state)
    assert saved_steps(str(tmp_path / "ckpt")) == [1, 2] and saved_steps(str(tmp_path / "nope")) == []
