"""What a run on several processes (multi-host) needs beyond one process.

Each process runs its share of the step's groups with the parameters resharded onto its own
devices (`rollout_mesh`, `sampler_params`);
the task stream, the feedback decisions and the bandit are functions of the run seed and the
step, so they agree everywhere; what needs the global view (metrics, the feedback log, the
bandit's signal) is gathered from every process. On one process every function here is the
identity or close to it.
"""

from __future__ import annotations

import json

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxscaffold.buckets import pow2_bucket
from jaxscaffold.models.local_mesh import local_mesh, local_rules, to_local
from jaxscaffold.models.qwen3 import param_shardings
from jaxscaffold.models.sharding import DEFAULT_RULES
from jaxscaffold.train.batching import build_batch


def process_share(n: int) -> range:
    """This process's contiguous block of `n` items (groups, eval tasks): process p of P takes
    [p n / P, (p + 1) n / P), so on one process everything, and on P the blocks in process
    order are the one-process order (the global batch keeps the one-process row order)."""
    p, count = jax.process_index(), jax.process_count()
    return range(p * n // count, (p + 1) * n // count)


def allgather_json(obj) -> list:
    """Every process's JSON-serialisable `obj`, in process order, on every process (a
    collective: every process must call it, in the same order)."""
    if jax.process_count() == 1:
        return [obj]
    data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray([data.size], np.int32))).reshape(-1)
    buf = np.zeros(int(sizes.max()), np.uint8)
    buf[:data.size] = data
    rows = np.asarray(multihost_utils.process_allgather(buf))
    return [json.loads(rows[p, :sizes[p]].tobytes()) for p in range(len(sizes))]


def rollout_mesh(config, train_mesh=None, devices: int = 0) -> tuple:
    """(mesh, rules) the samplers run on: this process's devices (on one process those of
    `train_mesh`, where the parameters are; default all) as `local_mesh` (tensor
    parallel over heads, MLP and vocabulary, the KV cache over kv heads where they divide,
    `local_rules`), on one process as on several, so a host's cache and weights are split
    over its devices (one device holding FEE's 128 x 16k-slot cache would need ~300 GB at
    4B). `devices` > 0: only the first that many (1: one device, e.g. to sample as a process
    of one device does). One process of one device: (None, the default rules), the unsharded
    sampler."""
    if jax.process_count() == 1:
        local = jax.local_devices() if train_mesh is None else list(train_mesh.devices.flat)
    else:
        local = jax.local_devices()
    local = local[:devices] if devices else local
    if jax.process_count() == 1 and len(local) == 1:
        return None, DEFAULT_RULES
    mesh = local_mesh(local)
    return mesh, local_rules(config, mesh.shape["tensor"])


def sampler_params(params, sampler):
    """The parameters rollouts sample with on `sampler` (built on `rollout_mesh`): resharded
    on device onto this process's mesh (`to_local`; on several processes a collective, every
    process calls it in the same order, as a jitted call on arrays spanning processes would
    need every process at once, and rollouts run on each process separately; no host copy of
    the model). On one process it is a jitted reshard (the training state's own arrays where
    the shardings already agree). A sampler without a mesh (a one-device process): replicated
    parameters as one device's replica, sharded ones as they are."""
    if sampler.mesh is not None:
        if jax.process_count() == 1 and not _on(params, sampler.mesh):  # a split pod (`mesh.rollout_devices`)
            return jax.device_put(params, param_shardings(sampler.config, sampler.mesh, sampler.rules))
        return to_local(params, sampler.config, sampler.mesh, sampler.rules)
    if jax.process_count() > 1:
        raise ValueError("on several processes a sampler runs on this process's mesh: build it on rollout_mesh()")
    if any(not x.is_fully_replicated for x in jax.tree.leaves(params)):
        return params
    return jax.tree.map(lambda x: x.addressable_data(0), params)


def _on(params, mesh) -> bool:
    """Whether every parameter lives on devices of `mesh`."""
    devices = set(mesh.devices.flat)
    return all(x.sharding.device_set <= devices for x in jax.tree.leaves(params))


def process_batch(conversations, adv, row_multiple: int) -> dict[str, np.ndarray]:
    """This process's rows of the global batch (on one process, the whole batch).

    Every process must feed arrays of one shape to `shard_batch`, so on several processes the
    rows are padded (with empty rows, which weigh nothing) to the most any process has and
    every row to the longest sequence of any process."""
    count = jax.process_count()
    if count == 1:
        return build_batch(conversations, adv, row_multiple=row_multiple)
    local_multiple = row_multiple // count if row_multiple % count == 0 else row_multiple
    sizes = allgather_json([len(conversations), max((len(c) for c in conversations), default=1)])
    rows = max(1, max(n for n, _ in sizes))
    rows += (-rows) % local_multiple
    min_len = pow2_bucket(max(t for _, t in sizes), 64)
    batch = build_batch(conversations, adv, row_multiple=local_multiple, min_len=min_len)
    return {k: np.pad(v, [(0, rows - v.shape[0])] + [(0, 0)] * (v.ndim - 1)) for k, v in batch.items()}
