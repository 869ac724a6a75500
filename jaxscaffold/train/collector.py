"""Rollouts that overlap training, with bounded staleness (`rollout.max_staleness = k > 0`).

A background thread runs `work.collect(job, params, step)` for the next steps while the
trainer trains (JAX releases the GIL while it computes, so the two interleave on the same
devices). The version of a policy is the number of training steps applied to it: training
step s updates version s - 1 into version s. Step t is collected with version
max(start, t - 1 - k): the oldest the bound allows, a fixed schedule, so a run's rollouts do
not depend on thread timing (k = 1: step s + 1's rollouts run while step s trains). The
trainer publishes each new version (a copy: the train step donates its state's buffers).

Partial rollouts (`rollout.partial`): a step's collect starts with its scheduled version, and
when the trainer publishes a newer one while the step's episodes run, they continue under it
from the next decode chunk (`ModelAgent`'s `refresh_params`); every token records the version
that sampled it, and the KV cache of the earlier tokens is kept (docs/async_training.md says
why). The swap's chunk depends on when the trainer publishes: such a run is not reproducible
token for token (the tokens before the first swap are the non-partial run's).

What the thread shares with the trainer, and how it stays consistent:
- the workload's state (task stream, bandit) advances in collect order; a snapshot taken right
  after each collect is what step t's checkpoint stores (`workload_state`), never a
  half-collected future step, so a resumed run collects again from the checkpoint's step;
- the environments: `paused()` holds the collector between two collects while the trainer
  evaluates on the same environment pool.

Several processes (a pod of hosts): the collectors of all processes collect the same steps in
the same order, each its share of the groups, and the thread must never issue a device
collective (one process's thread and main thread would issue theirs in a different order than
another's, which deadlocks or mixes their data). So:
- parameters: the main thread converts every version it hands over (the initial one, then each
  `publish`, at the same point of the loop on every process) to the samplers' arrays on this
  process's devices (`sampler_params`, a collective; on a split pod, `mesh.rollout_devices`,
  the move onto this process's rollout devices); `collect` and partial rollouts' refresh
  take those as they are;
- gathers inside `collect` (metrics, DAPO's mid-collect decision on every process's groups, the
  bandit's signal) go over the coordination service's key-value store (`multihost.StoreGather`,
  one channel per collector, the calls numbered: every process's thread gathers in the same
  order), not over device collectives: DAPO decides after each generation batch on global
  counts, so its gathers cannot move to the main thread.
The sampler's programs run on this process's devices only and need no peer, so they may
interleave with the main thread's collectives in any order.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp

from jaxscaffold.episodes.episode import Episode
from jaxscaffold.train.multihost import StoreGather, gathers_over_store, sampler_params, summed_over_processes

log = logging.getLogger(__name__)

_channel_ids = itertools.count()  # every process builds its collectors in the same order: the same names


class AheadCollector:
    """Collects steps `first_step..last_step` in a background thread, at most `max_staleness`
    versions behind the step that trains on them (module docstring)."""

    def __init__(self, work, job, params, *, version: int, first_step: int, last_step: int, max_staleness: int):
        if max_staleness < 1:
            raise ValueError(f"an ahead collector needs max_staleness >= 1, got {max_staleness}")
        self.work, self.job, self.k = work, job, max_staleness
        self.partial = job.cfg.rollout.partial
        if self.partial and not getattr(work, "partial_rollouts", False):
            raise ValueError(f"rollout.partial: the {type(work).__name__} workload does not decode in chunks that "
                             "new weights could join (the env workload does)")
        self._latest: tuple[int, Any] | None = None  # partial: the newest published version, if newer than needed
        self.start_version = version
        self.last_step = last_step
        self._cond = threading.Condition()
        self._params: dict[int, Any] = {version: self._own_copy(params)}  # published versions still needed
        self._ready: dict[int, tuple] = {}  # step -> (episodes, stats, version, collect seconds)
        self._states: dict[int, dict] = {}  # step -> the workload's state right after collecting it
        self._collecting = threading.Lock()  # held during one collect (`paused`)
        self._next = first_step
        self._stop = False
        self._error: BaseException | None = None
        self._gathers = StoreGather(f"collector{next(_channel_ids)}")  # (several processes; module docstring)
        self._thread = threading.Thread(target=self._run, name="rollout-collector", daemon=True)
        self._thread.start()

    def version_for(self, step: int) -> int:
        """The policy version step `step` is collected with."""
        return max(self.start_version, step - 1 - self.k)

    def _run(self) -> None:
        try:
            with gathers_over_store(self._gathers):
                self._collect_all()
        except BaseException as e:  # handed to the trainer by `next`
            if not self._stop:  # (else `close` cancelled a gather)
                log.exception("the rollout collector failed")
            with self._cond:
                self._error = e
                self._cond.notify_all()

    def _collect_all(self) -> None:
        while True:
            with self._cond:
                step = self._next
                if step > self.last_step:
                    return
                version = self.version_for(step)
                # The version the schedule names (it also bounds the steps waiting to k + 1).
                self._cond.wait_for(lambda: self._stop or version in self._params)
                if self._stop:
                    return
                params = self._params[version]
            with self._collecting:
                t = time.perf_counter()
                if self.partial:
                    episodes, stats = self.work.collect(self.job, params, step,
                                                        refresh_params=self._newest(version, params))
                else:
                    episodes, stats = self.work.collect(self.job, params, step)
                seconds = time.perf_counter() - t
                state = json.loads(json.dumps(self.work.get_state()))  # a copy, as the checkpoint stores it
            for e in episodes:  # (partial: the agent recorded every sampled token's already)
                e.record_version(version)
            if self.partial:  # (every process's tokens)
                stats = {**stats, **summed_over_processes(version_stats(episodes, step - 1, self.k))}
            with self._cond:
                self._ready[step] = (episodes, stats, version, seconds)
                self._states[step] = state
                self._next = step + 1
                # Versions no later step is collected with are released.
                for v in [v for v in self._params if v < self.version_for(step + 1)]:
                    del self._params[v]
                self._cond.notify_all()

    def next(self, step: int) -> tuple[list[Episode], dict, int, float]:
        """Step `step`'s (episodes, stats, the version that sampled them, collect seconds),
        waiting for them; a failure of the thread is raised here."""
        with self._cond:
            self._cond.wait_for(lambda: step in self._ready or self._error is not None)
            if self._error is not None:
                raise RuntimeError(f"rollout collection failed: {self._error!r}") from self._error
            out = self._ready.pop(step)
            for s in [s for s in self._states if s < step]:
                del self._states[s]
            self._cond.notify_all()
            return out

    def _newest(self, version: int, params):
        """Partial rollouts' `refresh_params` for a collect that starts with `version`: the
        newest published version (`version` until a newer one comes), as the sampler takes it."""
        ready: dict[int, Any] = {}  # one conversion per version, the current one only

        def refresh():
            with self._cond:
                latest = self._latest
            newest, source = (version, params) if latest is None or latest[0] <= version else latest
            if newest not in ready:
                ready.clear()
                ready[newest] = sampler_params(source, self.job.sampler)
            return ready[newest], newest

        return refresh

    def publish(self, params, version: int) -> None:
        """The policy after training step `version`; kept only if a later step samples with it
        (`_own_copy`: the next train step donates the state's buffers), or with partial
        rollouts, if a step still to collect may continue under it."""
        scheduled = version + 1 + self.k <= self.last_step  # step version + 1 + k samples with it
        if not scheduled and not (self.partial and version < self.last_step):
            return
        params = self._own_copy(params)
        with self._cond:
            if scheduled:
                self._params[version] = params
            if self.partial:  # (the scheduled copy itself while one is kept: no extra memory)
                self._latest = (version, params)
            self._cond.notify_all()

    def _own_copy(self, params):
        """Parameters the next train step cannot donate: on a split pod (`mesh.rollout_devices`)
        moved device to device onto the samplers' devices (on one process as on several), else a
        copy on the same devices. On several processes: this process's sampler arrays, copied
        (the conversion may hand out the state's own buffers), so the thread converts nothing
        (module docstring)."""
        if self.job.cfg.mesh.rollout_devices:  # new arrays on other devices (several processes: a collective)
            return sampler_params(params, self.job.sampler)
        if jax.process_count() > 1:
            return jax.tree.map(jnp.copy, sampler_params(params, self.job.sampler))
        return jax.tree.map(jnp.copy, params)

    def workload_state(self, step: int) -> dict:
        """The workload's state right after step `step` was collected (what its checkpoint stores)."""
        with self._cond:
            return self._states[step]

    @contextlib.contextmanager
    def paused(self):
        """No collect runs inside this block (evaluation shares the environment pool)."""
        with self._collecting:
            yield

    def close(self) -> None:
        """Stops after the collect in flight (if any; on several processes, at its next gather
        if a peer's thread does not answer) and joins the thread."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._gathers.cancel()  # (a collect waiting on a peer that stopped raises instead)
        self._thread.join()


def staleness_filter(episodes: list[Episode], version: int, max_staleness: int) -> tuple[list[Episode], dict]:
    """The episodes whose every training row is at most `max_staleness` versions older than
    `version` (a row's staleness: `version` minus the oldest version among its sampled
    tokens; no recorded version counts as `version`), and the step's metrics:
    `rollout/staleness_<d>` (training rows d versions old, for d = 0..k, and any older ones
    seen) and `rollout/stale_dropped_rows` (rows of the episodes dropped)."""
    hist = {d: 0 for d in range(max_staleness + 1)}
    kept, dropped = [], 0
    for e in episodes:
        rows = e.training_rows()
        ages = [version - min(conv.sampled_versions(), default=version) for conv in rows]
        for a in ages:
            hist[a] = hist.get(a, 0) + 1
        if any(a > max_staleness for a in ages):
            dropped += len(rows)
        else:
            kept.append(e)
    stats = {f"rollout/staleness_{d}": float(n) for d, n in sorted(hist.items())}
    stats["rollout/stale_dropped_rows"] = float(dropped)
    return kept, stats


def version_stats(episodes: list[Episode], version: int, max_staleness: int) -> dict:
    """Partial rollouts' per-token view of a step's staleness (`staleness_filter` counts rows
    by their oldest token): `rollout/token_staleness_<d>` (sampled tokens of the training rows
    d versions older than `version`, d = 0..k and any older seen) and
    `rollout/mixed_version_rows` (rows sampled by more than one version)."""
    hist = {d: 0 for d in range(max_staleness + 1)}
    mixed = 0
    for e in episodes:
        for conv in e.training_rows():
            versions = conv.sampled_versions()
            mixed += len(set(versions)) > 1
            for v in versions:
                hist[version - v] = hist.get(version - v, 0) + 1
    stats = {f"rollout/token_staleness_{d}": float(n) for d, n in sorted(hist.items())}
    stats["rollout/mixed_version_rows"] = float(mixed)
    return stats
