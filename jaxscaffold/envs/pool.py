"""A process pool of environments: batched, concurrent reset/step with crash and hang recovery.

    with EnvPool(num_workers=4, env_kwargs={"sciworld": {"step_limit": 15}}) as pool:
        obs = pool.reset(tasks)                # [Observation | EpisodeFailure], one per task
        out = pool.step({0: text0, 3: text3})  # {episode index: StepResult | EpisodeFailure}
        va = pool.call("valid_actions", [0])   # {episode index: value | EpisodeFailure}

Episodes are indexed by their position in the list given to the last `reset`; a reset ends
every episode of the previous one. The same Task may appear many times (a GRPO group): each
occurrence is its own episode on its own env instance. Episode ``i`` runs in worker
``i % num_workers``; workers run concurrently, and so do the env instances inside a worker
(below).

Asynchronous interface (what the episode driver uses):

    pool.open(tasks)             # a new batch; nothing is reset yet
    pool.submit_reset(i)         # episode i starts in the least loaded worker
    pool.submit_step(i, text)
    answers = pool.poll(timeout) # {episode: Observation | StepResult | EpisodeFailure}, as they come
    pool.end(i)                  # the caller is done with episode i (its env instance is free)

Workers take new episodes by load (the fewest episodes holding an env).

Inside a worker, each env instance has a *lane*: a thread that serves that instance's requests
in the order they came, while the other lanes serve theirs. So the requests of one episode stay
in order, and envs that wait (a JVM thinking, a socket, a user model answering, a sleep) wait
together: a slow env holds only its own episode, not its worker's. Answers go back over the
worker's pipe one at a time (a lock). An env whose instances must not run at once in one
process (`registry.EnvSpec.concurrent` false: ALFWorld, BFCL; or ``serial_envs=``) gets one
lane per worker for all its instances: its episodes in that worker take turns, as every
episode did before lanes.

Sizing (``num_workers``, `envs.num_workers`): threads of one process share one core (Python's
GIL), so for CPU-bound envs use about as many workers as cores; latency-bound envs no longer
need one worker per episode: a few workers serve any number of waiting episodes. More workers
still shrink what a hang or crash takes down (below) and spread env start-up (JVMs) over cores.

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
  episode (its env state is gone), reported in the same call when it was part of it (or, from
  `poll`, at once when a request of it was in flight), else at the episode's next `step` / `call`;
- ``"error"``: the env raised (e.g. `EnvError`); that env instance is discarded and rebuilt at
  the next reset, the worker keeps running.
A timed-out or crashed worker is killed (its whole process group) and restarted; the rest of
the batch completes. Failures are logged (`logging`) and counted in ``pool.stats``.

Failures of asynchronous requests are the same, reported by `poll`. A request's silence is
timed from when its lane starts on it, so healthy episodes of a worker keep answering while
one of its envs hangs, until that env's timeout. Then the whole worker is killed (its process
group: an env stuck in C code or a JVM cannot be stopped alone): the hung request fails as
``"timeout"``, every other request of that worker in flight as ``"lost"`` (at once), and its
other episodes as ``"lost"`` at their next step. A crash fails every request of the worker in
flight as ``"crash"`` (which env died is unknown). An env that raises discards only its own
instance (``"error"``); its lane and the worker go on.

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
import queue
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

_LANE_CLOSE_S = 10.0  # how long a closing worker waits for its lanes to close their envs


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


class _Lane:
    """A thread of a worker that serves, in the order they came, the requests of one env
    instance, or of every instance of an env that is not safe to run concurrently
    (`registry.EnvSpec.concurrent`). Lanes run at once, so a slow env holds only its own lane.
    The lane owns its instances: it builds them, runs them, discards them and closes them."""

    def __init__(self, build: Callable[[str], Any], send: Callable[[int, Any, Any], None]):
        self._build, self._send = build, send
        self.requests: queue.SimpleQueue = queue.SimpleQueue()  # (op, episode, instance, payload); None ends
        self._envs: dict[tuple[str, int], Any] = {}  # instance (env name, slot) -> env
        self._holder: dict[tuple[str, int], int] = {}  # instance -> the episode it serves
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _discard(self, inst: tuple[str, int]) -> None:
        env = self._envs.pop(inst, None)
        self._holder.pop(inst, None)
        if env is not None:
            try:
                env.close()
            except Exception:
                pass

    def _run(self, op: str, ep: int, inst: tuple[str, int], payload: Any) -> tuple[Any, Any]:
        if op in ("reset", "open"):
            if inst not in self._envs:
                self._envs[inst] = self._build(inst[0])
            self._holder[inst] = ep  # the instance's previous episode has ended
            return True, self._envs[inst].reset(payload)
        if self._holder.get(inst) != ep:
            raise LookupError(f"episode {ep} holds no env here (discarded after an error, or reused)")
        env = self._envs[inst]
        if op == "step":
            return True, env.step(payload)
        if op == "call":
            if payload not in getattr(type(env), "POOL_METHODS", ()):
                return None, f"{type(env).__name__}.{payload} is not in POOL_METHODS"
            return True, getattr(env, payload)()
        raise ValueError(f"unknown op {op!r}")

    def _serve(self) -> None:
        try:
            while (request := self.requests.get()) is not None:
                op, ep, inst, payload = request
                try:
                    ok, value = self._run(op, ep, inst, payload)
                except Exception as e:  # reported as an EpisodeFailure("error")
                    logger.debug("env error in %s of episode %d:\n%s", op, ep, traceback.format_exc())
                    self._discard(inst)
                    ok, value = False, f"{type(e).__name__}: {e}"
                try:  # send pickles the whole message before writing, so a failure leaves the pipe clean
                    self._send(ep, ok, value)
                except Exception as e:  # an env result that cannot be pickled: an error, with its cause
                    self._discard(inst)
                    self._send(ep, False, f"{op} returned a {type(value).__name__} that cannot be "
                                          f"sent from the worker ({type(e).__name__}: {e})")
        finally:
            for inst in list(self._envs):
                self._discard(inst)


def _worker_main(conn, factories: Mapping[str, Any], env_kwargs: Mapping[str, Mapping],
                 serial: frozenset[str], parent_pid: int) -> None:
    try:
        os.setpgrp()  # own process group: the pool kills the worker and its JVMs together
    except OSError:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the pool decides when workers end
    # terminate() (e.g. multiprocessing's exit handler): take the JVMs down too
    signal.signal(signal.SIGTERM, lambda *_: os.killpg(os.getpgrp(), signal.SIGKILL))
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    send_lock = threading.Lock()

    def send(ep: int, ok: Any, value: Any) -> None:
        with send_lock:  # lanes answer from their own threads: one message at a time
            conn.send(("item", ep, ok, value))

    def build(name: str):
        if name not in factories:
            raise KeyError(f"no env factory registered for {name!r}")
        return _resolve(factories[name])(**dict(env_kwargs.get(name, {})))

    lanes: dict[tuple[str, int | None], _Lane] = {}
    route: dict[int, tuple[str, int]] = {}  # episode -> its env instance (env name, slot)

    def lane(inst: tuple[str, int]) -> _Lane:
        key = (inst[0], None) if inst[0] in serial else inst  # a serial env: one lane for all its instances
        if key not in lanes:
            lanes[key] = _Lane(build, send)
        return lanes[key]

    try:
        while True:
            try:
                op, items = conn.recv()
            except (EOFError, OSError):
                break
            if op == "close":
                break
            if op == "reset":  # a batch: episodes take this worker's instances of their env in order
                route.clear()
                used: dict[str, int] = collections.Counter()
            for ep, payload in items:
                if op == "reset":
                    route[ep] = (payload.env, used[payload.env])
                    used[payload.env] += 1
                elif op == "open":  # asynchronous: one episode into the instance the pool chose
                    task, j = payload
                    for other in [k for k, inst in route.items() if inst == (task.env, j)]:
                        del route[other]  # that instance's previous episode has ended
                    route[ep], payload = (task.env, j), task
                elif ep not in route:
                    send(ep, False, f"episode {ep} holds no env in this worker")
                    continue
                lane(route[ep]).requests.put((op, ep, route[ep], payload))
    finally:
        for ln in lanes.values():  # each lane closes its own envs once its requests are done
            ln.requests.put(None)
        deadline = time.monotonic() + _LANE_CLOSE_S
        for ln in lanes.values():  # a hung lane is left to the pool, which kills the process group
            ln.thread.join(timeout=max(0.0, deadline - time.monotonic()))
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
        (per episode: the clock restarts at each episode the worker answers; asynchronously,
        per request, from when its env's lane starts on it).
      reset_timeout_s: the same for `reset` (first resets start JVMs: allow more).
      env_kwargs: env name -> keyword arguments of its constructor.
      factories: extra or overriding entries of the registry's import paths (import path or picklable
        callable).
      close_timeout_s: how long `close` waits for workers to close their envs before killing.
      serial_envs: env names whose instances must not run at once in one worker, besides the
        registry's (`EnvSpec.concurrent` false): a worker serves those one request at a time.
    """

    def __init__(self, num_workers: int, *, step_timeout_s: float = 60.0,
                 reset_timeout_s: float = 180.0,
                 env_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
                 factories: Mapping[str, str | Callable[..., Any]] | None = None,
                 close_timeout_s: float = 15.0, serial_envs: Iterable[str] = ()):
        if num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        self.num_workers = int(num_workers)
        self.step_timeout_s = float(step_timeout_s)
        self.reset_timeout_s = float(reset_timeout_s)
        self.close_timeout_s = float(close_timeout_s)
        self._factories = {**registry.import_paths(), **(factories or {})}
        self._env_kwargs = {k: dict(v) for k, v in (env_kwargs or {}).items()}
        self._serial = frozenset({n for n, s in registry.ENVS.items() if not s.concurrent} | set(serial_envs))
        self._ctx = mp.get_context("spawn")
        self._workers: list[_Worker] = []
        self._episodes: list[_Episode] = []
        self._generation = 0
        self.stats: collections.Counter[str] = collections.Counter()
        # The asynchronous interface's state (`open`): requests in flight per worker
        # ((episode, op, lane)), per lane of a worker (a lane answers in order: see `_lane`)
        # and the silence deadline of each lane's first, answers not yet polled, env instances
        # held per (worker, env name), and the offset of this batch's episode keys.
        self._inflight: dict[int, list[tuple[int, str, tuple]]] = {}
        self._lanes: dict[tuple, collections.deque] = {}
        self._deadline: dict[tuple, float] = {}
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
        for w, requests in self._inflight.items():
            if requests:  # answers of the previous batch still due: that worker's state is unknown
                self._restart(w, "lost", "a new batch opened while it was busy", "", {}, {}, others="lost")
        for ep in self._episodes:
            ep.status = "done" if ep.status == "active" else ep.status
        self._key_base += len(self._episodes) + 1  # keys of the previous batch's stray answers never match
        self._episodes = [_Episode(task=t, worker=-1, generation=-1) for t in tasks]
        self._inflight = {w.index: [] for w in self._workers}
        self._lanes, self._deadline, self._ready = {}, {}, {}
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
            expired = [lane for lane, q in self._lanes.items() if q and self._deadline[lane] <= now]
            for w in sorted({lane[0] for lane in expired}):
                self._restart_async(w, "timeout", hung={self._lanes[lane][0] for lane in expired if lane[0] == w})
            busy = [w for w, q in self._inflight.items() if q]
            if self._ready or not busy or (until is not None and now >= until):
                out, self._ready = self._ready, {}
                return out
            wait_s = min(self._deadline[lane] for lane, q in self._lanes.items() if q) - now
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
            args=(child_conn, self._factories, self._env_kwargs, self._serial, os.getpid()))
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

    def _lane(self, i: int) -> tuple:
        """The lane of the worker that serves episode i's requests, as the worker keys it: its
        env instance, or its env's one lane there if that env is serial."""
        ep = self._episodes[i]
        return (ep.worker, ep.task.env, None if ep.task.env in self._serial else ep.instance)

    def _send(self, w: int, i: int, op: str, payload: Any) -> None:
        lane = self._lane(i)
        requests = self._lanes.setdefault(lane, collections.deque())
        if not requests:  # the lane starts on it now: its silence is timed from here
            self._deadline[lane] = time.monotonic() + self._timeout(op)
        requests.append((i, op))
        self._inflight[w].append((i, op, lane))
        try:
            self._workers[w].conn.send((op, [(self._key_base + i, payload)]))
        except (OSError, EOFError, ValueError) as e:
            self._restart_async(w, "crash", f"could not send to worker: {e}")

    def _free(self, i: int) -> None:
        ep = self._episodes[i]
        if ep.instance is not None:
            self._held[(ep.worker, ep.task.env)].discard(ep.instance)
            ep.instance = None

    def _timeout(self, op: str) -> float:
        return self.reset_timeout_s if op == "open" else self.step_timeout_s

    def _drain_async(self, w: int) -> bool:
        """Reads every answer a worker has ready (asynchronous API). False if its pipe broke."""
        conn, inflight = self._workers[w].conn, self._inflight[w]
        try:
            while inflight and conn.poll():
                kind, key, ok, value = conn.recv()
                i = key - self._key_base
                request = next((r for r in inflight if r[0] == i), None)
                if kind != "item" or request is None:
                    continue  # a previous batch's answer
                inflight.remove(request)
                lane = self._lanes[request[2]]
                lane.remove(request[:2])  # its lane's first: a lane answers in order
                if lane:  # the lane moves on to its next request
                    self._deadline[request[2]] = time.monotonic() + self._timeout(lane[0][1])
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

    def _restart_async(self, w: int, kind: str, reason: str = "",
                       hung: set[tuple[int, str]] | None = None) -> None:
        """Restarts worker w (asynchronous API). A crash fails its requests in flight as
        "crash" (which of them died is unknown). A timeout fails the `hung` requests ((episode,
        op), each its lane's first) as "timeout" and every other request in flight, healthy
        but gone with the worker, as "lost". Its other episodes are lost (reported now if
        answered but not polled, else at their next step)."""
        if kind == "timeout":
            i, op = min(hung)
            reason = f"episode {i} gave no answer within {self._timeout(op):.1f}s during {op}"
            pending = {w: {i for i, _ in hung}}
            for i in sorted({i for i, _, _ in self._inflight[w]} - pending[w]):
                if self._episodes[i].status == "active":
                    self._fail(i, "lost", f"worker {w} was restarted ({kind}: {reason})", self._ready)
        else:
            pending = {w: {i for i, _, _ in self._inflight[w]}}
        self._inflight[w].clear()
        for lane in [lane for lane in self._lanes if lane[0] == w]:
            del self._lanes[lane], self._deadline[lane]
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
