"""Per-process (per-host) meshes: each process samples on a mesh of its own devices.

On several processes a jitted call on arrays spanning processes needs every process at once,
while rollouts run on each process separately. So each process gets a mesh of its
addressable devices (`local_mesh`, `data x fsdp x tensor` = 1 x 1 x local devices: tensor
parallel over heads, MLP width and vocabulary), and the training parameters are resharded
onto it on device (`to_local`): one collective `jax.device_put` from the training mesh to a
global mesh whose rows are the processes (`process_rows_mesh`; parameters replicated over
processes, sharded over each process's devices), whose addressable shards are then this
process's arrays on its local mesh. Nothing goes through host memory and no device holds the
whole model (unless a dimension does not divide, see `local_rules`).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding

from jaxscaffold.models import qwen3
from jaxscaffold.models.config import Qwen3Config
from jaxscaffold.models.sharding import DEFAULT_RULES, MESH_AXES, ShardingRules

_AUTO = (AxisType.Auto,) * len(MESH_AXES)


def local_mesh(devices=None) -> Mesh:
    """This process's addressable devices (or those of them in `devices`: on one process, the
    training mesh's) as a 1 x 1 x n `data x fsdp x tensor` mesh, in the global device order."""
    mine = _devices_of(jax.process_index())
    if devices is not None:
        mine = [d for d in mine if d in set(devices)]
    devices = np.asarray(mine, dtype=object).reshape(1, 1, -1)
    return Mesh(devices, MESH_AXES, axis_types=_AUTO)


def _devices_of(process: int) -> list:
    """A process's devices in one order every process agrees on (the global device order)."""
    return [d for d in jax.devices() if d.process_index == process]


@functools.cache
def process_rows_mesh() -> Mesh:
    """Every device, one `data` row per process (in process order), each row that process's
    local devices over `tensor` in `local_mesh`'s order: a global mesh whose per-process
    slices are the local meshes."""
    rows = [_devices_of(p) for p in range(jax.process_count())]
    if len({len(r) for r in rows}) != 1:
        raise ValueError(f"per-host meshes need as many devices on every process, have {[len(r) for r in rows]}")
    return Mesh(np.asarray(rows, dtype=object).reshape(len(rows), 1, -1), MESH_AXES, axis_types=_AUTO)


def local_rules(config: Qwen3Config, tensor: int, rules: ShardingRules = DEFAULT_RULES) -> ShardingRules:
    """`rules` for a per-host mesh of `tensor` devices: vocabulary, query heads, kv heads and
    MLP width over `tensor` where the dimension divides (else replicated: a sharding must
    divide), `embed` replicated (no fsdp inside a host), and the KV cache over kv heads when
    `num_kv_heads` divides (a head is never split: attention runs per head; else the cache is
    replicated on the host's devices)."""
    divides = lambda n: n % tensor == 0  # noqa: E731
    pick = lambda ok: "tensor" if ok else None  # noqa: E731
    return dataclasses.replace(
        rules, embed=None, vocab=pick(divides(config.vocab_size)), q_heads=pick(divides(config.q_dim)),
        kv_heads=pick(divides(config.kv_dim)), mlp=pick(divides(config.intermediate_size)),
        cache_heads=pick(divides(config.num_kv_heads)))


def to_local(params: dict, config: Qwen3Config, mesh: Mesh, rules: ShardingRules) -> dict:
    """The model's parameters (any shardings, possibly spanning processes) as this process's
    arrays on its `local_mesh` `mesh`, sharded by the logical axes under `rules`
    (`local_rules`). A collective on several processes (every process calls it, in the same
    order); the copy is device to device. `mesh` may hold none of the parameters' devices (a
    split pod's rollout devices)."""
    source = set().union(*(x.sharding.device_set for x in jax.tree.leaves(params)))
    if not set(mesh.devices.flat) <= source:  # a split pod: the parameters are on the training devices only
        return _onto_other_devices(params, config, source, mesh, rules)
    if jax.process_count() == 1:
        # A jitted identity: on device (jax.device_put of a fully addressable array may reshard
        # through the host); the parameters must be on `mesh`'s devices in its order (jax.devices()'s).
        return _identity(params, out_shardings=qwen3.param_shardings(config, mesh, rules))
    # Arrays spanning processes onto a mesh of the same devices (in any order): jax.device_put
    # reshards them on device, a collective (its transfers pass jax.transfer_guard's
    # "disallow_explicit" for host <-> device: tests/train/test_multihost_rollout.py).
    placed = jax.device_put(params, qwen3.param_shardings(config, process_rows_mesh(), rules))
    return jax.tree.map(lambda x: _local_view(x, mesh), placed)


def _onto_other_devices(params: dict, config: Qwen3Config, source: set, mesh: Mesh, rules: ShardingRules) -> dict:
    """`to_local` for a split pod, where `mesh` (this process's rollout devices) holds none of
    the parameters. Multi-controller JAX reshards across processes only within one device set,
    so in two steps, both device to device: a collective reshard onto a staging mesh of the
    same (training) devices, each process's a row of groups of `mesh.size` devices, each group
    holding the sampler's layout (tensor parallel over the group, replicated over groups and
    processes); then this process's first group's shards copied to its rollout devices, shard
    j of the group to device j of `mesh` (the same slices, no reshard)."""
    rows = [[d for d in jax.devices() if d in source and d.process_index == p] for p in range(jax.process_count())]
    m = mesh.size
    if len({len(r) for r in rows}) != 1 or len(rows[0]) % m:
        raise ValueError(f"a split pod needs as many training devices on every process, a multiple of its {m} "
                         f"sampler devices; have {[len(r) for r in rows]}")
    staging = Mesh(np.asarray(rows, dtype=object).reshape(len(rows), -1, m), MESH_AXES, axis_types=_AUTO)
    target = qwen3.param_shardings(config, staging, rules)
    # (one process: the jitted identity, on device as in `to_local`; several: the collective)
    placed = _identity(params, out_shardings=target) if jax.process_count() == 1 else jax.device_put(params, target)
    group, targets = list(staging.devices[jax.process_index(), 0]), list(mesh.devices.flat)
    leaves, treedef = jax.tree.flatten(placed)
    shards = [{s.device: s.data for s in x.addressable_shards} for x in leaves]
    # One batched copy of every leaf's group shards, shard j onto rollout device j.
    moved = jax.device_put([by_device[d] for by_device in shards for d in group], targets * len(leaves))
    out = []
    for i, x in enumerate(leaves):
        on = dict(zip(targets, moved[i * m:(i + 1) * m]))
        sharding = NamedSharding(mesh, x.sharding.spec)  # the spec names only `tensor`
        out.append(jax.make_array_from_single_device_arrays(
            x.shape, sharding, [on[d] for d in sharding.addressable_devices_indices_map(x.shape)]))
    return jax.tree.unflatten(treedef, out)


def _identity(tree, out_shardings):
    return jax.jit(_same, out_shardings=out_shardings)(tree)


def _same(tree):
    return tree


def _local_view(x: jax.Array, mesh: Mesh) -> jax.Array:
    """This process's shards of `x` (replicated over processes) as an array on `mesh` (no copy)."""
    sharding = NamedSharding(mesh, x.sharding.spec)  # the spec names no `data`: replicated over rows
    by_device = {s.device: s.data for s in x.addressable_shards}
    shards = [by_device[d] for d in sharding.addressable_devices_indices_map(x.shape)]
    return jax.make_array_from_single_device_arrays(x.shape, sharding, shards)


def device_bytes(tree) -> dict:
    """Bytes each device holds of a pytree of arrays (from their addressable shards)."""
    out: dict = {}
    for x in jax.tree.leaves(tree):
        for s in x.addressable_shards:
            out[s.device] = out.get(s.device, 0) + math.prod(s.data.shape) * s.data.dtype.itemsize
    return out
