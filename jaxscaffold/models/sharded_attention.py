"""Fused attention kernels (Pallas splash on TPU, cuDNN on GPU) on a device mesh.

A Pallas or cuDNN call is one opaque custom call: XLA's partitioner cannot split it the way
it splits einsums, so on a multi-device mesh the kernel runs under `jax.shard_map`, each
device on its own rows and heads, as the sharding rules lay them out: rows over the `batch`
axes (data, fsdp), heads over the `q_heads` axis (tensor). The sequence stays whole on every
device (the rules do not shard it), so no exchange between devices is needed: attention is
independent per row and per kv head.

The mesh is the one the caller traces under (`kernel_mesh`, which the train step enters);
with none, or one device, the kernel runs as it is. An axis that does not divide the rows (or the kv heads) is left out: those devices compute
the same slice, which is correct, only redundant.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Callable

import jax
from jax.sharding import PartitionSpec

from jaxscaffold.models.sharding import DEFAULT_RULES, ShardingRules


_RULES = contextvars.ContextVar("kernel_rules", default=DEFAULT_RULES)


@contextlib.contextmanager
def kernel_mesh(mesh, rules: ShardingRules = DEFAULT_RULES):
    """The context a step is traced under so that its fused kernels run per device on
    `mesh`, laid out by `rules` (None: no mesh, the kernels run as they are)."""
    if mesh is None:
        yield
        return
    token = _RULES.set(rules)
    try:
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            yield
    finally:
        _RULES.reset(token)


def _dividing_axes(names, mesh, size: int) -> tuple[str, ...]:
    """The axes of `names` (a rules entry) that are in `mesh` with more than one device,
    kept while their product divides `size`."""
    names = () if names is None else (names,) if isinstance(names, str) else tuple(names)
    kept = []
    for name in names:
        if name in mesh.axis_names and mesh.shape[name] > 1:
            if size % (math.prod(mesh.shape[a] for a in kept) * mesh.shape[name]) == 0:
                kept.append(name)
    return tuple(kept)


def kernel_specs(mesh, batch: int, kv_heads: int, rules: ShardingRules = DEFAULT_RULES):
    """PartitionSpecs of q/k/v [B, T, heads, K] and of segment ids [B, T] under shard_map."""
    rows = _dividing_axes(rules.batch, mesh, batch)
    heads = _dividing_axes(rules.q_heads, mesh, kv_heads)  # whole groups of query heads per kv head
    rows_spec = rows if rows else None
    return PartitionSpec(rows_spec, None, heads if heads else None, None), PartitionSpec(rows_spec, None)


def on_mesh(kernel: Callable, q_BTHK, k_BTGK, v_BTGK, segment_ids_BT, *, mesh=None,
            rules: ShardingRules | None = None):
    """`kernel(q, k, v, segment_ids)` (causal self-attention within segments) on each device's
    rows and heads of `mesh` under `rules` (default: those `kernel_mesh` set while tracing)."""
    mesh = jax.sharding.get_abstract_mesh() if mesh is None else mesh
    rules = _RULES.get() if rules is None else rules
    if mesh.empty or mesh.size == 1:
        return kernel(q_BTHK, k_BTGK, v_BTGK, segment_ids_BT)
    qkv, seg = kernel_specs(mesh, q_BTHK.shape[0], k_BTGK.shape[2], rules)
    # check_vma off: a Pallas / cuDNN call carries no varying-axes annotations to check.
    return jax.shard_map(kernel, mesh=mesh, in_specs=(qkv, qkv, qkv, seg), out_specs=qkv,
                         check_vma=False)(q_BTHK, k_BTGK, v_BTGK, segment_ids_BT)


def traced_mesh():
    """(mesh, rules) a step is traced under (`kernel_mesh`): the abstract mesh (empty with
    none) and its rules."""
    return jax.sharding.get_abstract_mesh(), _RULES.get()


def paged_axes(mesh, batch: int, kv_heads: int, rules: ShardingRules = DEFAULT_RULES):
    """The axes a paged cache is split over on `mesh`: (rows and pool pages: the rules'
    batch axes that divide the rows; kv heads: its cache_heads axes that divide them)."""
    return _dividing_axes(rules.batch, mesh, batch), _dividing_axes(rules.cache_heads, mesh, kv_heads)
