"""A process pool of environments: batched, concurrent reset/step with crash and hang recovery.

    with EnvPool(num_workers=4, env_kwargs={"sciworld": {"step_limit": 15}}) as pool:
        obs = pool.reset(tasks)                # [Observation | EpisodeFailure], one per task
        out = pool.step({0: text0, 3: text3})  # {episode index: StepResult | EpisodeFailure}
        va = pool.call("valid_actions", [0])   # {episode index: value | EpisodeFailure}

Episodes are indexed by their position in the list given to the last `reset`; a reset ends
every episode of the previous one. The same Task may appear many times (a GRPO group): each
occurrence is its own episode on its own env instance. Episode ``i`` runs in worker
``i % num_workers``; a worker runs its episodes one after the other, workers run concurrently.

Asynchronous interface (what the episode driver uses):

    pool.open(tasks)             # a new batch; nothing is reset yet
    pool.submit_reset(i)         # episode i starts in the least loaded worker
    pool.submit_step(i, text)
    answers = pool.poll(timeout) # {episode: Observation | StepResult | EpisodeFailure}, as they come
    pool.end(i)                  # the caller is done with episode i (its env instance is free)

A worker answers its requests in the order they came, so an episode waits only for the
requests sent to its worker before its own; workers take new episodes by load (the fewest
episodes holding an env), so a slow env delays only the few episodes sharing its worker.
Size: for latency-bound envs (a JVM thinking, a user model answering) more workers than
cores pay off, up to one per episode in flight; CPU-bound envs gain nothing past the cores.

Workers are ``spawn``-ed processes, each the leader of its own process group (so the JVMs or
other children an env starts die with it). Inside a worker, env instances are created lazily
from the registry's specs (env name -> ``"module:Class"`` import path, `registry.import_paths`,
resolved in the worker; per pool, ``factories=`` adds or overrides entries), one instance per
episode slot, reused across resets.

Failures. An `EpisodeFailure` is an infrastructure failure (never a reward): the caller
drops that episode from the batch. Causes (``kind``):
- ``"timeout"``: the worker gave no answer for ``step_timeout_s`` (``reset_timeout_s`` for
  resets) since the call started or since its previous answer;
- ``"crash"``: the worker process died (killed, segfault, out of memory);
- ``"lost"``: the episode lived in a worker that was killed or restarted because of another
  episode (its env state is gone), reported in the same call when it was part of it, else at
  the episode's next `step` / `call`;
- ``"error"``: the env raised (e.g. `EnvError`); that env instance is discarded and rebuilt at
  the next reset, the worker keeps running.
A timed-out or crashed worker is killed (its whole process group) and restarted; the rest of
the batch completes. Failures are logged (`logging`) and counted in ``pool.stats``.

Failures of asynchronous requests are the same, reported by `poll` (a request's silence is
timed from when its worker starts on it).

`close()` (or leaving the ``with`` block) closes every env, ends the workers and kills what is
left of their process groups. A pool is not thread-safe: drive it from one thread.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import logging
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import threading
import time
import traceback
import weakref
from typing import Any, Callable, Iterable, Mapping, Sequence

from jaxscaffold.envs import registry
from jaxscaffold.envs.base import EpisodeFailure, Observation, StepResult, Task

logger = logging.getLogger(__name__)

__all__ = ["EnvPool"]


# ----------------------------------------------------------------------------- worker side


def _resolve(factory: str | Callable[..., Any]) -> Callable[..., Any]:
    if callable(factory):
        return factory
    module, _, attr = factory.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _watch_parent(parent_pid: int) -> None:
    """End this worker's process group if the pool's process disappears."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            try:
                os.killpg(os.getpgrp(), signal.SIGKILL)
            finally:
                os._exit(1)


def _worker_main(conn, factories: Mapping[str, Any], env_kwargs: Mapping[str, Mapping],
                 parent_pid: int) -> None:
    try:
        os.setpgrp()  # own process group: the pool kills the worker and its JVMs together
    except OSError:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the pool decides when workers end
    # terminate() (e.g. multiprocessing's exit handler): take the JVMs down too
    signal.signal(signal.SIGTERM, lambda *_: os.killpg(os.getpgrp(), signal.SIGKILL))
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    slots: dict[str, list[Any]] = collections.defaultdict(list)  # env name -> instances
    episodes: dict[int, Any] = {}  # episode index -> its instance (current reset)

    def discard(ep: int) -> None:
        env = episodes.pop(ep, None)
        for insts in slots.values():
            for j, inst in enumerate(insts):
                if inst is env and env is not None:
                    insts[j] = None
        if env is not None:
            try:
                env.close()
            except Exception:
                pass

    def instance(name: str, j: int):
        insts = slots[name]
        while len(insts) <= j:
            insts.append(None)
        if insts[j] is None:
            if name not in factories:
                raise KeyError(f"no env factory registered for {name!r}")
            insts[j] = _resolve(factories[name])(**dict(env_kwargs.get(name, {})))
        return insts[j]

    try:
        while True:
            try:
                op, items = conn.recv()
            except (EOFError, OSError):
                break
            if op == "close":
                break
            if op == "reset":
                episodes.clear()
                used: dict[str, int] = collections.Counter()
            for ep, payload in items:
                try:
                    if op == "reset":
                        task: Task = payload
                        j = used[task.env]
                        used[task.env] += 1
                        env = instance(task.env, j)
                        episodes[ep] = env
                        value = env.reset(task)
                    elif op == "open":  # asynchronous: one episode into the instance the pool chose
                        task, j = payload
                        env = instance(task.env, j)
                        for other in [k for k, e in episodes.items() if e is env]:
                            del episodes[other]  # that instance's previous episode has ended
                        episodes[ep] = env
                        value = env.reset(task)
                    elif op == "step":
                        value = episodes[ep].step(payload)
                    elif op == "call":
                        env = episodes[ep]
                        if payload not in getattr(type(env), "POOL_METHODS", ()):
                            conn.send(("item", ep, None,
                                       f"{type(env).__name__}.{payload} is not in POOL_METHODS"))
                            continue
                        value = getattr(env, payload)()
                    else:
                        raise ValueError(f"unknown op {op!r}")
                    ok = True
                except Exception as e:  # reported as an EpisodeFailure("error")
                    value = f"{type(e).__name__}: {e}"
                    logger.debug("env error in %s of episode %d:\n%s", op, ep,
                                 traceback.format_exc())
                    discard(ep)
                    ok = False
                try:  # send pickles the whole message before writing, so a failure leaves the pipe clean
                    conn.send(("item", ep, ok, value))
                except Exception as e:  # an env result that cannot be pickled: an error, with its cause
                    discard(ep)
                    conn.send(("item", ep, False, f"{op} returned a {type(value).__name__} that cannot be "
                                                  f"sent from the worker ({type(e).__name__}: {e})"))
    finally:
        for insts in slots.values():
            for env in insts:
                if env is not None:
                    try:
                        env.close()
                    except Exception:
                        pass
        try:
            conn.close()
        except Exception:
            pass


# ----------------------------------------------------------------------------- pool side


def _kill_group(proc: mp.process.BaseProcess | None) -> None:
    """SIGKILL a worker, its process group and (if psutil is there) any descendant."""
    if proc is None or proc.pid is None:
        return
    pids: list[int] = []
    try:
        import psutil

        try:
            pids = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        except psutil.Error:
            pass
    except ImportError:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the worker is its group's leader
    except (ProcessLookupError, PermissionError):
        pass
    for pid in [proc.pid, *pids]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.join(timeout=10)


class _CallerError(str):
    """A `call` of a method the env does not list in POOL_METHODS (raised as ValueError)."""


@dataclasses.dataclass
class _Worker:
    index: int
    proc: Any
    conn: Any
    generation: int


@dataclasses.dataclass
class _Episode:
    task: Task
    worker: int
    generation: int
    status: str = "active"  # "active" | "done" | "failed"
    failure: EpisodeFailure | None = None
    instance: int | None = None  # asynchronous: its env instance in its worker (None: none held)


def _shutdown(workers: list[_Worker], timeout_s: float) -> None:
    for w in workers:
        try:
            w.conn.send(("close", []))
        except Exception:
            pass
    deadline = time.monotonic() + timeout_s
    for w in workers:
        w.proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for w in workers:
        _kill_group(w.proc)  # also reaps a group member left behind by a clean exit
        try:
            w.conn.close()
        except Exception:
            pass
    workers.clear()


class EnvPool:
    """Environments in `num_workers` processes. See the module docstring for the contract.

    Args:
      num_workers: worker processes (started now; JVMs etc. start at the first reset).
      step_timeout_s: longest silence of a worker during `step` / `call` before it is killed
        (per episode: the clock restarts at each episode the worker answers).
      reset_timeout_s: the same for `reset` (first resets start JVMs: allow more).
      env_kwargs: env name -> keyword arguments of its constructor.
      factories: extra or overriding entries of the registry's import paths (import path or picklable
        callable).
      close_timeout_s: how long `close` waits for workers to close their envs before killing.
    """

    def __init__(self, num_workers: int, *, step_timeout_s: float = 60.0,
                 reset_timeout_s: float = 180.0,
                 env_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
                 factories: Mapping[str, str | Callable[..., Any]] | None = None,
                 close_timeout_s: float = 15.0):
        if num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        self.num_workers = int(num_workers)
        self.step_timeout_s = float(step_timeout_s)
        self.reset_timeout_s = float(reset_timeout_s)
        self.close_timeout_s = float(close_timeout_s)
        self._factories = {**registry.import_paths(), **(factories or {})}
        self._env_kwargs = {k: dict(v) for k, v in (env_kwargs or {}).items()}
        self._ctx = mp.get_context("spawn")
        self._workers: list[_Worker] = []
        self._episodes: list[_Episode] = []
        self._generation = 0
        self.stats: collections.Counter[str] = collections.Counter()
        # The asynchronous interface's state (`open`): requests in flight per worker (in the
        # order the worker answers them), its silence deadline, answers not yet polled, env
        # instances held per (worker, env name), and the offset of this batch's episode keys.
        self._inflight: dict[int, collections.deque] = {}
        self._deadline: dict[int, float] = {}
        self._ready: dict[int, Any] = {}
        self._held: dict[tuple[int, str], set[int]] = collections.defaultdict(set)
        self._key_base = 0
        self._closed = False
        for i in range(self.num_workers):
            self._workers.append(self._spawn(i))
        self._finalizer = weakref.finalize(self, _shutdown, self._workers, self.close_timeout_s)

    # -- public API

    def reset(self, tasks: Sequence[Task]) -> list[Observation | EpisodeFailure]:
        """Start one episode per task (episode index = position in `tasks`)."""
        self._check_open()
        self._ensure_alive()
        for ep in self._episodes:  # a reset ends the previous batch
            ep.status = "done" if ep.status == "active" else ep.status
        self._episodes = [_Episode(task=t, worker=i % self.num_workers,
                                   generation=self._workers[i % self.num_workers].generation)
                          for i, t in enumerate(tasks)]
        per_worker: dict[int, list[tuple[int, Any]]] = {w.index: [] for w in self._workers}
        for i, t in enumerate(tasks):
            per_worker[i % self.num_workers].append((i, t))
        self.stats["resets"] += len(tasks)
        results = self._run("reset", per_worker, self.reset_timeout_s)
        return [results[i] for i in range(len(tasks))]

    def step(self, actions: Mapping[int, str]) -> dict[int, StepResult | EpisodeFailure]:
        """Step the given episodes with the model's output text. Episodes that already failed
        get their `EpisodeFailure` back; stepping a finished or unknown episode raises
        ValueError (before anything is sent)."""
        self._check_open()
        return self._dispatch("step", dict(actions), self.step_timeout_s)

    def call(self, method: str, episodes: Iterable[int], *,
             timeout_s: float | None = None) -> dict[int, Any]:
        """Call a no-argument method listed in the env class's ``POOL_METHODS`` (e.g.
        ``"valid_actions"``) on each episode's env; returns value or EpisodeFailure."""
        self._check_open()
        out = self._dispatch("call", {i: method for i in episodes},
                             self.step_timeout_s if timeout_s is None else timeout_s,
                             allow_done=True)
        bad = [v for v in out.values() if isinstance(v, _CallerError)]
        if bad:
            raise ValueError(str(bad[0]))
        return out

    # -- asynchronous API: one episode at a time, answers polled as they come

    def open(self, tasks: Sequence[Task]) -> None:
        """Starts a batch of episodes (index = position in `tasks`; the previous batch ends)
        without resetting any: `submit_reset(i)` starts episode i in the least loaded worker,
        on an env instance of its own there, so a worker's envs do not wait for each other's
        episodes to end. Answers come from `poll`."""
        self._check_open()
        self._ensure_alive()
        for w, queue in self._inflight.items():
            if queue:  # answers of the previous batch still due: that worker's state is unknown
                self._restart(w, "lost", "a new batch opened while it was busy", "", {}, {}, others="lost")
        for ep in self._episodes:
            ep.status = "done" if ep.status == "active" else ep.status
        self._key_base += len(self._episodes) + 1  # keys of the previous batch's stray answers never match
        self._episodes = [_Episode(task=t, worker=-1, generation=-1) for t in tasks]
        self._inflight = {w.index: collections.deque() for w in self._workers}
        self._deadline, self._ready = {}, {}
        self._held.clear()

    def submit_reset(self, i: int) -> None:
        """Resets episode `i` of the open batch (once); its Observation comes from `poll`."""
        self._check_open()
        ep = self._episodes[i]
        if ep.worker >= 0:
            raise ValueError(f"episode {i} was already reset")
        load = collections.Counter(e.worker for e in self._episodes if e.instance is not None)
        w = min(range(self.num_workers), key=lambda k: (load[k], len(self._inflight[k]), k))
        held = self._held[(w, ep.task.env)]
        ep.worker, ep.generation = w, self._workers[w].generation
        ep.instance = min(set(range(len(held) + 1)) - held)
        held.add(ep.instance)
        self.stats["resets"] += 1
        self._send(w, i, "open", (ep.task, ep.instance))

    def submit_step(self, i: int, text: str) -> None:
        """Steps episode `i` with the agent's text; its StepResult (or EpisodeFailure) comes
        from `poll`. A failed episode's failure comes back again."""
        self._check_open()
        if not (isinstance(i, int) and 0 <= i < len(self._episodes)) or self._episodes[i].worker < 0:
            raise ValueError(f"episode {i!r} was not reset in this batch")
        ep = self._episodes[i]
        if ep.status == "done":
            raise ValueError(f"episode {i} is finished; reset before stepping it again")
        if ep.status == "active" and ep.generation != self._workers[ep.worker].generation:
            self._fail(i, "lost", "its worker was restarted", {})
        if ep.status == "failed":
            self._ready[i] = ep.failure
            self._free(i)
            return
        self.stats["steps"] += 1
        self._send(ep.worker, i, "step", text)

    def poll(self, timeout_s: float | None = None) -> dict[int, Any]:
        """The answers ready now (episode -> Observation, StepResult or EpisodeFailure),
        waiting up to `timeout_s` (None: until one comes) when there is none. A worker silent
        past its deadline is killed and restarted, a dead one restarted: their episodes fail
        as in `step`."""
        self._check_open()
        until = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            busy = [w for w, q in self._inflight.items() if q]
            dead = [w for w in busy if not self._drain_async(w)]
            for w in busy:
                if w not in dead and self._inflight[w] and not self._workers[w].proc.is_alive():
                    self._drain_async(w)  # its last words, then it is gone
                    if self._inflight[w]:
                        dead.append(w)
            for w in dead:
                self._restart_async(w, "crash", f"worker process died (exit code {self._workers[w].proc.exitcode})")
            now = time.monotonic()
            for w in [w for w, q in self._inflight.items() if q and self._deadline[w] <= now]:
                op = self._inflight[w][0][1]
                timeout = self.reset_timeout_s if op == "open" else self.step_timeout_s
                self._restart_async(w, "timeout", f"no answer within {timeout:.1f}s during {op}")
            busy = [w for w, q in self._inflight.items() if q]
            if self._ready or not busy or (until is not None and now >= until):
                out, self._ready = self._ready, {}
                return out
            wait_s = min(self._deadline[w] for w in busy) - now
            if until is not None:
                wait_s = min(wait_s, until - now)
            mpc.wait([*(self._workers[w].conn for w in busy), *(self._workers[w].proc.sentinel for w in busy)],
                     timeout=max(0.0, wait_s))

    def end(self, i: int) -> None:
        """The caller is done with episode `i` (finished, truncated or dropped): its env
        instance is free for the next episode of its worker."""
        ep = self._episodes[i]
        if ep.status == "active":
            ep.status = "done"
        self._free(i)

    def worker_pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    def episode_worker(self, episode: int) -> int:
        return self._episodes[episode].worker

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        _shutdown(self._workers, self.close_timeout_s)

    def __enter__(self) -> "EnvPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("EnvPool is closed")

    def _spawn(self, index: int) -> _Worker:
        self._generation += 1
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(
            target=_worker_main, name=f"envpool-worker-{index}", daemon=True,
            args=(child_conn, self._factories, self._env_kwargs, os.getpid()))
        proc.start()
        child_conn.close()
        return _Worker(index=index, proc=proc, conn=parent_conn, generation=self._generation)

    def _dispatch(self, op: str, payloads: dict[int, Any], timeout_s: float,
                  allow_done: bool = False) -> dict[int, Any]:
        results: dict[int, Any] = {}
        per_worker: dict[int, list[tuple[int, Any]]] = collections.defaultdict(list)
        self._ensure_alive()
        for i in payloads:
            if not (isinstance(i, int) and 0 <= i < len(self._episodes)):
                raise ValueError(f"unknown episode index {i!r} (last reset had "
                                 f"{len(self._episodes)} episodes)")
            ep = self._episodes[i]
            if ep.status == "done" and not allow_done:
                raise ValueError(f"episode {i} is finished; reset before stepping it again")
        for i, payload in payloads.items():
            ep = self._episodes[i]
            if ep.status == "active" and ep.generation != self._workers[ep.worker].generation:
                self._fail(i, "lost", "its worker was restarted", results)
            if ep.status == "failed":
                results[i] = ep.failure
                continue
            per_worker[ep.worker].append((i, payload))
        if op == "step":
            self.stats["steps"] += sum(len(v) for v in per_worker.values())
        results.update(self._run(op, per_worker, timeout_s))
        return results

    def _send(self, w: int, i: int, op: str, payload: Any) -> None:
        queue = self._inflight[w]
        if not queue:  # the worker starts on it now: its silence is timed from here
            self._deadline[w] = time.monotonic() + (self.reset_timeout_s if op == "open" else self.step_timeout_s)
        queue.append((i, op))
        try:
            self._workers[w].conn.send((op, [(self._key_base + i, payload)]))
        except (OSError, EOFError, ValueError) as e:
            self._restart_async(w, "crash", f"could not send to worker: {e}")

    def _free(self, i: int) -> None:
        ep = self._episodes[i]
        if ep.instance is not None:
            self._held[(ep.worker, ep.task.env)].discard(ep.instance)
            ep.instance = None

    def _drain_async(self, w: int) -> bool:
        """Reads every answer a worker has ready (asynchronous API). False if its pipe broke."""
        conn, queue = self._workers[w].conn, self._inflight[w]
        try:
            while queue and conn.poll():
                kind, key, ok, value = conn.recv()
                i = key - self._key_base
                ops = {j: op for j, op in queue}
                if kind != "item" or i not in ops:
                    continue  # a previous batch's answer
                queue.remove((i, ops[i]))
                if queue:  # the worker moves on to its next request
                    op = queue[0][1]
                    self._deadline[w] = time.monotonic() + (self.reset_timeout_s if op == "open"
                                                            else self.step_timeout_s)
                if ok:
                    self._ready[i] = value
                    if isinstance(value, StepResult) and value.done:
                        self._episodes[i].status = "done"
                        self._free(i)
                else:  # the worker discarded that env instance (rebuilt at its next use)
                    self.stats["env_errors"] += 1
                    self._fail(i, "error", str(value), self._ready)
                    self._free(i)
        except (EOFError, OSError):
            return False
        return True

    def _restart_async(self, w: int, kind: str, reason: str) -> None:
        """Restarts worker w (asynchronous API): its requests in flight fail as `kind`, its
        other episodes are lost (reported now if answered but not polled, else at their next step)."""
        pending = {w: {i for i, _ in self._inflight[w]}}
        self._inflight[w].clear()
        self._restart(w, kind, reason, "step", self._ready, pending)
        for key in [k for k in self._held if k[0] == w]:
            del self._held[key]  # the new worker holds no instance
        for ep in self._episodes:
            if ep.worker == w and ep.generation != self._workers[w].generation:
                ep.instance = None  # its instance died with the old worker

    def _fail(self, i: int, kind: str, reason: str, results: dict[int, Any]) -> None:
        ep = self._episodes[i]
        failure = EpisodeFailure(reason=reason, kind=kind, episode=i, task=ep.task,
                                 worker=ep.worker)
        ep.status, ep.failure = "failed", failure
        results[i] = failure
        self.stats["failures"] += 1
        self.stats[f"failures_{kind}"] += 1
        # INFO: a training step reports its failed episodes in one line (`train.failures.StepGuard`).
        logger.info("episode %d (%s %s) failed [%s]: %s", i, ep.task.env, ep.task.task_id,
                       kind, reason)

    def _ensure_alive(self) -> None:
        """Restart workers that died between calls (their episodes fail as crashes)."""
        for w in list(self._workers):
            if not w.proc.is_alive():
                self._restart(w.index, "crash", f"worker process died between calls (exit code "
                              f"{w.proc.exitcode})", "", {}, {}, others="crash")

    def _restart(self, w: int, kind: str, reason: str, op: str, results: dict[int, Any],
                 pending: dict[int, set[int]], others: str = "lost") -> None:
        old = self._workers[w]
        logger.warning("worker %d (pid %s) %s: %s; restarting it", w, old.proc.pid, kind, reason)
        _kill_group(old.proc)
        try:
            old.conn.close()
        except Exception:
            pass
        self.stats["worker_restarts"] += 1
        self.stats[{"timeout": "timeouts", "crash": "crashes"}.get(kind, kind)] += 1
        self._workers[w] = self._spawn(w)
        for i in sorted(pending.get(w, ())):
            self._fail(i, kind, reason, results)
        pending[w] = set()
        # Everything else that lived in the old worker is gone with it.
        for i, ep in enumerate(self._episodes):
            if ep.worker != w or ep.generation != old.generation or ep.status != "active":
                continue
            if i in results:
                r = results[i]
                if op == "step" and isinstance(r, StepResult) and r.done:
                    continue  # finished before the failure: its result stands
                self._fail(i, "lost",
                           f"worker {w} was restarted ({kind}) after this episode answered", results)
            else:  # not part of this call: reported at its next step / call
                self._fail(i, others, reason if others == kind else
                           f"worker {w} was restarted ({kind}: {reason})", {})

    def _run(self, op: str, per_worker: Mapping[int, list[tuple[int, Any]]],
             timeout_s: float) -> dict[int, Any]:
        results: dict[int, Any] = {}
        pending: dict[int, set[int]] = {}
        deadline: dict[int, float] = {}
        for w, items in per_worker.items():
            if not items and op != "reset":
                continue
            pending[w] = {i for i, _ in items}
            deadline[w] = time.monotonic() + timeout_s
            try:
                self._workers[w].conn.send((op, items))
            except (OSError, EOFError, ValueError) as e:
                self._restart(w, "crash", f"could not send to worker: {e}", op, results, pending)
        while any(pending.values()):
            live = [w for w, p in pending.items() if p]
            now = time.monotonic()
            wait_s = max(0.0, min(deadline[w] for w in live) - now)
            conn_of = {self._workers[w].conn: w for w in live}
            sent_of = {self._workers[w].proc.sentinel: w for w in live}
            ready = mpc.wait([*conn_of, *sent_of], timeout=wait_s)
            dead: set[int] = set()
            for obj in ready:
                if obj in conn_of:
                    w = conn_of[obj]
                    if not self._drain(w, op, results, pending, deadline, timeout_s):
                        dead.add(w)
                else:
                    w = sent_of[obj]
                    self._drain(w, op, results, pending, deadline, timeout_s)
                    if pending[w]:
                        dead.add(w)
            for w in dead:
                code = self._workers[w].proc.exitcode
                self._restart(w, "crash", f"worker process died (exit code {code})", op,
                              results, pending)
            now = time.monotonic()
            for w in [w for w, p in pending.items() if p and deadline[w] <= now]:
                self._restart(w, "timeout", f"no answer within {timeout_s:.1f}s during {op}", op,
                              results, pending)
        return results

    def _drain(self, w: int, op: str, results: dict[int, Any], pending: dict[int, set[int]],
               deadline: dict[int, float], timeout_s: float) -> bool:
        """Read every message a worker has ready. False if its pipe is broken."""
        conn = self._workers[w].conn
        try:
            while pending[w] and conn.poll():
                kind, i, ok, value = conn.recv()
                if kind != "item" or i not in pending[w]:
                    continue
                pending[w].discard(i)
                deadline[w] = time.monotonic() + timeout_s
                if ok is None:  # the caller asked for something the env does not offer
                    results[i] = _CallerError(value)
                elif ok:
                    results[i] = value
                    if op == "step" and isinstance(value, StepResult) and value.done:
                        self._episodes[i].status = "done"
                else:
                    self.stats["env_errors"] += 1
                    self._fail(i, "error", str(value), results)
        except (EOFError, OSError):
            return False
        return True
