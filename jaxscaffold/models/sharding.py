"""Device meshes, logical axes and the one rules object that maps them to mesh axes.

Every parameter and activation is described by *logical* axis names (`"embed"`, `"mlp"`,
`"batch"`, ...). A `ShardingRules` object maps each logical name to a mesh axis (or a tuple
of mesh axes, or None for replicated). Changing the parallelism layout means changing the
rules, never the model code.

Mesh axes: `data` (pure data parallelism: parameters replicated), `fsdp` (data parallel
with parameters and optimizer state sharded), `tensor` (tensor / model parallelism over
heads, MLP width and vocabulary).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

log = logging.getLogger(__name__)

MESH_AXES = ("data", "fsdp", "tensor")
MeshAxis = str | tuple[str, ...] | None


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Sizes of the `data`, `fsdp` and `tensor` mesh axes; one of them may be -1 (fill)."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1

    def resolve(self, num_devices: int) -> tuple[int, int, int]:
        sizes = [self.data, self.fsdp, self.tensor]
        if sizes.count(-1) > 1:
            raise ValueError(f"at most one mesh axis may be -1, got {self}")
        known = math.prod(s for s in sizes if s != -1)
        if any(s == 0 or s < -1 for s in sizes):
            raise ValueError(f"mesh axis sizes must be positive or -1, got {self}")
        if -1 in sizes:
            if num_devices % known:
                raise ValueError(
                    f"mesh {self} does not fit {num_devices} devices: "
                    f"{num_devices} is not divisible by {known}")
            sizes[sizes.index(-1)] = num_devices // known
        if math.prod(sizes) != num_devices:
            raise ValueError(
                f"mesh data={sizes[0]} x fsdp={sizes[1]} x tensor={sizes[2]} = {math.prod(sizes)} "
                f"devices does not fit the {num_devices} available devices")
        return tuple(sizes)


def make_mesh(config: MeshConfig = MeshConfig(), devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Builds a `data x fsdp x tensor` mesh over all (global, multi-host) devices.

    `jax.make_mesh` orders devices to follow the physical topology on TPU and GPU; on CPU
    and for an explicit device list the order given is used.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = config.resolve(len(devices))
    # Auto axes: XLA's partitioner propagates shardings from the inputs and the explicit
    # in/out shardings of each jitted step; the model code carries no sharding types.
    auto = (AxisType.Auto,) * len(MESH_AXES)
    if len(devices) == jax.device_count():
        return jax.make_mesh(shape, MESH_AXES, devices=devices, axis_types=auto)
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES, axis_types=auto)


def maybe_initialize_distributed() -> bool:
    """Starts JAX's multi-controller runtime when this process is one of several.

    On TPU pods (and SLURM / Open MPI clusters) `jax.distributed.initialize()` discovers the
    coordinator by itself; elsewhere set `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES` and
    `JAX_PROCESS_ID`. Returns whether the runtime was initialised.
    """
    if jax.distributed.is_initialized():
        return True
    explicit = os.environ.get("JAX_COORDINATOR_ADDRESS")
    on_pod = any(k in os.environ for k in ("TPU_WORKER_HOSTNAMES", "SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE"))
    if not explicit and not on_pod:
        return False
    if explicit:
        jax.distributed.initialize(
            coordinator_address=explicit,
            num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
            process_id=int(os.environ["JAX_PROCESS_ID"]),
        )
    else:
        jax.distributed.initialize()
    log.info("jax.distributed: process %d of %d, %d global devices",
             jax.process_index(), jax.process_count(), jax.device_count())
    return True


@dataclasses.dataclass(frozen=True)
class ShardingRules:
    """Logical axis name -> mesh axis (or axes, or None = replicated)."""

    batch: MeshAxis = ("data", "fsdp")
    seq: MeshAxis = None
    layers: MeshAxis = None
    vocab: MeshAxis = "tensor"
    embed: MeshAxis = "fsdp"
    q_heads: MeshAxis = "tensor"  # fused heads x head_dim of the query / attention output
    kv_heads: MeshAxis = "tensor"  # fused kv_heads x head_dim of keys and values
    mlp: MeshAxis = "tensor"
    head_dim: MeshAxis = None
    norm: MeshAxis = None
    cache_seq: MeshAxis = None
    cache_heads: MeshAxis = "tensor"

    def spec(self, logical_axes: Sequence[str | None]) -> PartitionSpec:
        """The PartitionSpec of an array with these logical axes."""
        return PartitionSpec(*(None if a is None else getattr(self, a) for a in logical_axes))

    def sharding(self, mesh: Mesh, logical_axes: Sequence[str | None]) -> NamedSharding:
        return NamedSharding(mesh, self.spec(logical_axes))


DEFAULT_RULES = ShardingRules()


def tree_shardings(mesh: Mesh, logical_tree: Any, rules: ShardingRules = DEFAULT_RULES) -> Any:
    """Maps a pytree of logical-axis tuples to a pytree of NamedShardings."""
    return jax.tree.map(lambda axes: rules.sharding(mesh, axes), logical_tree, is_leaf=_is_axes)


def _is_axes(x) -> bool:
    return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def check_divisible(shape: Sequence[int], sharding: NamedSharding, name: str = "array") -> None:
    """Raises a clear error when a dimension is not divisible by its mesh axes' size."""
    for dim, axes in zip(shape, sharding.spec):
        if axes is None:
            continue
        axes = axes if isinstance(axes, tuple) else (axes,)
        size = math.prod(sharding.mesh.shape[a] for a in axes)
        if dim % size:
            raise ValueError(
                f"{name}: dimension {dim} of shape {tuple(shape)} is not divisible by mesh axes "
                f"{axes} of size {size}")


def shard_batch(batch: Any, mesh: Mesh, rules: ShardingRules = DEFAULT_RULES,
                logical_axes: Sequence[str | None] = ("batch", "seq")) -> Any:
    """Places a pytree of process-local host arrays as global arrays sharded over the batch.

    Each process passes its own rows; `jax.make_array_from_process_local_data` assembles the
    global batch (on a single process this is an ordinary sharded `device_put`).
    """
    def place(x):
        x = np.asarray(x)
        sharding = rules.sharding(mesh, tuple(logical_axes[: x.ndim]) + (None,) * (x.ndim - len(logical_axes)))
        return jax.make_array_from_process_local_data(sharding, x)

    return jax.tree.map(place, batch)
