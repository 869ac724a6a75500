"""What a run on several processes (multi-host) needs beyond one process.

Each process runs its share of the step's groups with the parameters resharded onto its own
devices (`rollout_mesh`, `sampler_params`);
the task stream, the feedback decisions and the bandit are functions of the run seed and the
step, so they agree everywhere; what needs the global view (metrics, the feedback log, the
bandit's signal) is gathered from every process. On one process every function here is the
identity or close to it.

Two channels carry the gathers: device collectives (`multihost_utils.process_allgather`) in
the main thread, and, for a background thread that must gather while the main thread runs its
own collectives (the rollout collector of `rollout.max_staleness`), the jax.distributed
coordination service's key-value store (`StoreGather`, `gathers_over_store`): two threads'
device collectives would be issued in a different order on each process.
"""

from __future__ import annotations

import contextlib
import json
import threading

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


_thread = threading.local()  # `channel`: this thread's StoreGather inside `gathers_over_store`


def allgather_json(obj) -> list:
    """Every process's JSON-serialisable `obj`, in process order, on every process (a
    collective: every process must call it, in the same order; inside `gathers_over_store`,
    in this thread's order over its store channel)."""
    if jax.process_count() == 1:
        return [obj]
    channel = getattr(_thread, "channel", None)
    if channel is not None:
        return channel.allgather_json(obj)
    data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray([data.size], np.int32))).reshape(-1)
    buf = np.zeros(int(sizes.max()), np.uint8)
    buf[:data.size] = data
    rows = np.asarray(multihost_utils.process_allgather(buf))
    return [json.loads(rows[p, :sizes[p]].tobytes()) for p in range(len(sizes))]


def summed_over_processes(counts: dict[str, float]) -> dict[str, float]:
    """Every process's `counts` summed key by key (a key some process lacks counts 0 there);
    on one process `counts` itself. A gather (`allgather_json`)."""
    parts = allgather_json(counts)
    if len(parts) == 1:
        return counts
    total: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            total[k] = total.get(k, 0.0) + v
    return total


@contextlib.contextmanager
def gathers_over_store(channel: StoreGather):
    """In this block this thread's `allgather_json` gathers over `channel` instead of device
    collectives (and `sampler_params` refuses to issue one), so it never interleaves with the
    collectives of the main thread."""
    _thread.channel = channel
    try:
        yield
    finally:
        _thread.channel = None


class StoreGather:
    """`allgather_json` over the coordination service's key-value store: no device collective,
    so a background thread can gather while the main thread runs its own collectives. Every
    process must make the same sequence of calls on its channel of the same `name` (call n of
    process p writes `jaxscaffold/gather/<name>/<n>/<p>` and reads every process's key of call
    n). A process deletes its key of call n - 1 once it has read every key of call n: each
    other process wrote that key after it had read call n - 1's, so the store holds at most
    two calls' keys per channel (the last call's stay until the run's coordinator stops).
    `cancel` makes a waiting call (and every later one) raise: a thread stopped while a peer
    never answers is not left blocked."""

    POLL_MS = 1000  # a wait on a peer's key re-checks `cancel` this often

    def __init__(self, name: str):
        self.prefix = f"jaxscaffold/gather/{name}"
        self.calls = 0
        self._cancelled = threading.Event()

    def allgather_json(self, obj) -> list:
        client = _coordination_client()
        call, me = self.calls, jax.process_index()
        self.calls += 1
        mine = json.dumps(obj)
        client.key_value_set(f"{self.prefix}/{call}/{me}", mine)
        parts = [json.loads(mine if p == me else self._get(client, f"{self.prefix}/{call}/{p}"))
                 for p in range(jax.process_count())]
        if call:
            client.key_value_delete(f"{self.prefix}/{call - 1}/{me}")
        return parts

    def _get(self, client, key: str) -> str:
        while True:
            try:
                return client.blocking_key_value_get(key, self.POLL_MS)
            except jax.errors.JaxRuntimeError as e:
                if "DEADLINE_EXCEEDED" not in str(e):
                    raise
            if self._cancelled.is_set():
                raise RuntimeError(f"gather {key} cancelled")

    def cancel(self) -> None:
        self._cancelled.set()


def _coordination_client():
    """The jax.distributed coordination service's client (its key-value store is what orbax
    and jax's array serialization use for their barriers). JAX exposes the client only as a
    private attribute: this is the one place that reads it."""
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("gathering over the key-value store needs jax.distributed to be initialized")
    return client


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
    parameters as one device's replica, sharded ones as they are.

    On several processes, parameters that are already this process's arrays on the sampler's
    mesh (converted by the main thread: `collector.AheadCollector`) are returned as they are;
    inside `gathers_over_store` (a background thread) any others are refused, as converting
    them is a collective."""
    if sampler.mesh is not None:
        if jax.process_count() > 1:
            target = param_shardings(sampler.config, sampler.mesh, sampler.rules)
            if all(x.is_fully_addressable and x.sharding.is_equivalent_to(s, x.ndim)
                   for x, s in zip(jax.tree.leaves(params), jax.tree.leaves(target), strict=True)):
                return params
            if getattr(_thread, "channel", None) is not None:
                raise RuntimeError("sampler_params: converting the training parameters is a collective, which a "
                                   "background thread must not issue; convert them in the main thread")
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
