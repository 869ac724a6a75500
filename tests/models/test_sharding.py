"""Sharded Qwen3 on 8 fake CPU devices equals the unsharded model; shardings follow the rules."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxscaffold.models import hf_io, qwen3
from jaxscaffold.models.sharding import MeshConfig, ShardingRules, make_mesh, shard_batch
from tests.models.hf_reference import make_hf_model

MESHES = [MeshConfig(data=1, fsdp=2, tensor=4), MeshConfig(data=2, fsdp=4, tensor=1),
          MeshConfig(data=2, fsdp=2, tensor=2)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    make_hf_model(vocab=256, hidden=64, inter=128, heads=8, kv_heads=4, head_dim=16).save_pretrained(path)
    return str(path)


def test_eight_fake_devices():
    assert jax.device_count() == 8, "tests/conftest.py sets 8 fake CPU devices"


@pytest.mark.parametrize("mesh_config", MESHES, ids=str)
def test_sharded_forward_equals_unsharded(checkpoint, mesh_config):
    config, params = hf_io.load_pretrained(checkpoint)
    mesh = make_mesh(mesh_config)
    _, sharded = hf_io.load_pretrained(checkpoint, mesh=mesh)
    tokens = np.random.RandomState(0).randint(0, config.vocab_size, (8, 12)).astype(np.int32)
    segments = np.ones_like(tokens)
    segments[3, 9:] = 0
    ref = jax.jit(qwen3.forward, static_argnums=1)(params, config, tokens, segment_ids_BT=segments)
    batch = shard_batch({"tokens": tokens, "segments": segments}, mesh)
    out_sharding = NamedSharding(mesh, P(("data", "fsdp"), None, "tensor"))
    fwd = jax.jit(qwen3.forward, static_argnums=1, out_shardings=out_sharding)
    out = fwd(sharded, config, batch["tokens"], segment_ids_BT=batch["segments"])
    assert out.sharding == out_sharding
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("mesh_config", MESHES[:2], ids=str)
def test_every_parameter_sharded_as_the_rules_say(checkpoint, mesh_config):
    rules = ShardingRules()
    mesh = make_mesh(mesh_config)
    config, params = hf_io.load_pretrained(checkpoint, mesh=mesh, rules=rules)
    axes = qwen3.param_logical_axes(config)
    flat_params = jax.tree_util.tree_flatten_with_path(params)[0]
    flat_axes = dict(jax.tree_util.tree_flatten_with_path(axes, is_leaf=lambda x: isinstance(x, tuple))[0])
    assert len(flat_params) == len(flat_axes)
    for path, arr in flat_params:
        expected = NamedSharding(mesh, rules.spec(flat_axes[path]))
        assert arr.sharding.is_equivalent_to(expected, arr.ndim), (jax.tree_util.keystr(path), arr.sharding)
        # Each device holds exactly the slice its index says (checks the streaming loader).
        full = np.asarray(arr)
        for shard in arr.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), full[shard.index])


def test_sharded_init_and_custom_rules():
    mesh = make_mesh(MeshConfig(data=1, fsdp=8, tensor=1))
    rules = ShardingRules(vocab=None, embed="fsdp", mlp=None)
    config = qwen3.Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
                               num_heads=4, num_kv_heads=2, head_dim=16)
    params = qwen3.init_params(config, jax.random.key(0), mesh=mesh, rules=rules)
    assert params["layers"]["gate"].sharding.spec == P(None, "fsdp", None)
    assert params["embed"].sharding.spec == P(None, "fsdp")
    unsharded = qwen3.init_params(config, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(params["layers"]["q"]), np.asarray(unsharded["layers"]["q"]))


def test_mesh_that_does_not_fit_is_a_clear_error():
    with pytest.raises(ValueError, match="does not fit"):
        make_mesh(MeshConfig(data=3, fsdp=1, tensor=1))
    with pytest.raises(ValueError, match="not divisible"):
        make_mesh(MeshConfig(data=-1, fsdp=3, tensor=1))


def test_indivisible_parameter_is_a_clear_error(tmp_path):
    make_hf_model(vocab=250, heads=4, kv_heads=2).save_pretrained(tmp_path)
    mesh = make_mesh(MeshConfig(data=1, fsdp=2, tensor=4))
    with pytest.raises(ValueError, match="not divisible"):
        hf_io.load_pretrained(str(tmp_path), mesh=mesh)
