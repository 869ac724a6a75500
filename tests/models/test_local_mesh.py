"""Per-host meshes on one process (8 fake devices): the rules follow what divides, and the
reshard onto the local mesh keeps every value, splits the bytes, and never goes through host."""

import dataclasses

import jax
import numpy as np
from jax.sharding import Mesh

from jaxscaffold import backends
from jaxscaffold.models import qwen3
from jaxscaffold.models.config import Qwen3Config, tiny
from jaxscaffold.models.hf_io import EOS_IDS
from jaxscaffold.models.local_mesh import device_bytes, local_mesh, local_rules, to_local
from jaxscaffold.models.sharding import DEFAULT_RULES, MESH_AXES, MeshConfig, make_mesh
from jaxscaffold.rollout.engine import Sampler


def test_local_mesh_is_this_process_devices_over_tensor():
    mesh = local_mesh()
    assert dict(mesh.shape) == {"data": 1, "fsdp": 1, "tensor": 8}
    assert list(mesh.devices.ravel()) == jax.local_devices()


def test_rules_shard_what_divides():
    c = tiny()  # vocab 151936, q 4 x 16, kv 2 x 16, mlp 192
    r = local_rules(c, 8)
    assert (r.vocab, r.q_heads, r.kv_heads, r.mlp, r.embed) == ("tensor", "tensor", "tensor", "tensor", None)
    assert r.cache_heads is None  # 2 kv heads on 8 devices: a head is never split
    assert local_rules(c, 2).cache_heads == "tensor"
    odd = local_rules(c.replace(vocab_size=100, intermediate_size=196), 8)
    assert odd.vocab is None and odd.mlp is None and odd.q_heads == "tensor"
    # Fields the per-host mesh does not change are the given rules'.
    assert dataclasses.replace(r, vocab=DEFAULT_RULES.vocab, q_heads=DEFAULT_RULES.q_heads,
                               kv_heads=DEFAULT_RULES.kv_heads, mlp=DEFAULT_RULES.mlp, embed=DEFAULT_RULES.embed,
                               cache_heads=DEFAULT_RULES.cache_heads) == DEFAULT_RULES


def test_to_local_keeps_values_and_splits_bytes_on_device():
    c = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=8,
                    num_kv_heads=8, head_dim=8)
    params = qwen3.init_params(c, jax.random.key(0), mesh=make_mesh(MeshConfig(data=1, fsdp=2, tensor=4)))
    reference = jax.tree.map(np.asarray, params)
    mesh = local_mesh()
    with jax.transfer_guard_host_to_device("disallow_explicit"):
        local = jax.block_until_ready(to_local(params, c, mesh, local_rules(c, 8)))
    total = sum(x.nbytes for x in jax.tree.leaves(reference))
    assert max(device_bytes(local).values()) <= 1.05 / 8 * total
    for x, ref in zip(jax.tree.leaves(local), jax.tree.leaves(reference)):
        assert x.sharding.mesh == mesh
        for shard in x.addressable_shards:  # every device's block is the reference's slice
            np.testing.assert_array_equal(np.asarray(shard.data), ref[shard.index])


def test_sampler_cache_replicated_where_kv_heads_do_not_divide():
    c = tiny()
    mesh = local_mesh()
    sampler = Sampler(c, stop_ids=EOS_IDS, batch_size=2, max_len=32, mesh=mesh, rules=local_rules(c, 8))
    state = sampler.init_state()
    for buf in jax.tree.leaves(state.cache.k):
        assert buf.sharding.is_fully_replicated
    assert not state.logits_BV.sharding.is_fully_replicated  # the vocabulary is split


def test_a_one_device_host_mesh_decodes_as_unsharded():
    """On several processes of one device each, a host's sampler decodes as an unsharded one
    (the CPU layout's column blocks), so its tokens are the one-process run's bit for bit."""
    one = Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1, 1), MESH_AXES)
    unsharded = backends.for_sampler("per_layer").column_blocks
    assert backends.for_sampler("per_layer", mesh=one).column_blocks == unsharded
    assert backends.for_sampler("per_layer", mesh=local_mesh()).column_blocks == 1
