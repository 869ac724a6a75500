"""One training step's rollouts of a tiny model on an env whose steps take time, three ways in one run.

  python launch/bench.py rollout [--json] [--latency-ms 200 --latency-p99-ms 2000 --turns 2-14 --rows 64
                                  --max-new-tokens 16] [--env sciworld] [--admit-wait-ms MS] [--staleness K --steps S]

- `lockstep_s`: `EnvWorkload.collect` of one step with the lock-step driver (`rollout.lockstep`):
  every live episode decodes, then every env steps, then every row prefills;
- `async_s`: the same step with the asynchronous driver (the default): each episode advances on
  its own;
- `bound_s`: what no driver can beat, the larger of (a) the same tokens decoded with zero env
  latency (the same step, same seeds, on the latency env with its sleeps at 0: the faster
  driver's wall time) and (b) the longest single episode's chain: its turns x one decode turn
  (the zero-latency lock-step run's wall time over its turns) + its own env latencies (the
  latency env's draws for its actions, `envs.latency.draws`).

Ratios: `async_over_lockstep` (goal <= 0.4 at the defaults) and `async_over_bound` (goal <= 1.25).
Before the timed runs the sampler compiles every program the rows of the untimed runs may
meet in any grouping (`Sampler.compile_programs`), so each timed run's `compile_s` (XLA
compiling inside it) is ~0; `prefill_calls`, `prefill_rows` and `prefill_work` (rows x width x
window, padding included) count each run's prefills. Every run restores the workload's task
stream first, so all of them roll out the same tasks with the same sampling seeds (the same
tokens, up to ties that batch shape can flip). `--admit-wait-ms` sets `rollout.admit_wait_ms`.

`--env sciworld`: the real env and its real latency (resets included). Its latency cannot be
set to zero, so (a) is the lock-step run's accelerator-busy seconds (`Timings.busy_s`: the same
tokens decoded) and (b) charges each reset and step an env's own mean seconds per call, from the
lock-step run's timed pool calls (`own_seconds_per_call`).

`--staleness K --steps S`: also S whole training steps (rollout + update) through the trainer,
synchronous (lock step, staleness 0) and asynchronous (async driver, `rollout.max_staleness=K`):
`steps_per_hour_sync`, `steps_per_hour_async` and their ratio, from the wall clock of steps 2..S
(step 1 compiles).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import tempfile
import time

from benchmarks.common import REPORT

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# --workers 8: a worker per episode (the default 32 started 24 processes per pool that 8 rows never use:
# a quick run, the device check's rollout part, 23.3 -> 15.6 CPU-s).
QUICK = ["--rows", "8", "--workers", "8", "--turns", "1-3", "--max-new-tokens", "4", "--latency-ms", "50",
         "--latency-p99-ms", "200"]


# ----------------------------------------------------------------------------- arguments


def parse_turns(text: str) -> tuple[int, int]:
    """"2-14" -> (2, 14)."""
    lo, sep, hi = text.partition("-")
    try:
        turns = (int(lo), int(hi) if sep else int(lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--turns takes MIN-MAX, e.g. 2-14, got {text!r}") from None
    if not 1 <= turns[0] <= turns[1]:
        raise argparse.ArgumentTypeError(f"--turns needs 1 <= MIN <= MAX, got {text!r}")
    return turns


def parse_args(argv, quick: bool = False) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench.py rollout", description="one step's rollouts: lock step, async, bound")
    p.add_argument("--latency-ms", type=float, default=200.0, help="median env step latency (log-normal)")
    p.add_argument("--latency-p99-ms", type=float, default=2000.0, help="99th percentile of the step latency")
    p.add_argument("--turns", type=parse_turns, default=(2, 14), help="episode length MIN-MAX, uniform")
    p.add_argument("--rows", type=int, default=64, help="episodes of the step (groups x group size)")
    p.add_argument("--group-size", type=int, default=8, help="rollouts per task")
    p.add_argument("--max-new-tokens", type=int, default=16, help="tokens per model turn")
    p.add_argument("--workers", type=int, default=32,
                   help="env pool worker processes, both drivers (latency-bound envs: more than cores is fine)")
    p.add_argument("--vocabulary", default="words", choices=["words", "qwen3"],
                   help="the tiny model's vocabulary: words (the rooms testbed's ~240 ids; default: on a CPU a "
                        "152k-row unembedding makes every run decode-bound) or qwen3 (the real one)")
    p.add_argument("--env", default="latency", choices=["latency", "sciworld"], help="the env to roll out on")
    p.add_argument("--max-turns", type=int, default=10, help="--env sciworld: env steps per episode")
    p.add_argument("--admit-wait-ms", type=float, default=None,
                   help="rollout.admit_wait_ms (default: the config's): how long reset episodes wait to be admitted together")
    p.add_argument("--staleness", type=int, default=0, help="also time whole steps with rollout.max_staleness=K")
    p.add_argument("--steps", type=int, default=0, help="training steps of that comparison (>= 2)")
    args = p.parse_args((QUICK if quick else []) + list(argv))
    if args.rows < 1 or args.rows % args.group_size:
        p.error(f"--rows {args.rows} must be a positive multiple of --group-size {args.group_size}")
    if args.latency_p99_ms < args.latency_ms:
        p.error(f"--latency-p99-ms {args.latency_p99_ms} is below --latency-ms {args.latency_ms}")
    if (args.staleness or args.steps) and (args.staleness < 1 or args.steps < 2):
        p.error("whole training steps need --staleness K >= 1 and --steps S >= 2")
    return args


# ----------------------------------------------------------------------------- arithmetic


def chain_s(turns: int, env_s: float, turn_s: float) -> float:
    """One episode's own critical path: its decode turns one after the other, each followed by
    its env's latency."""
    return turns * turn_s + env_s


def bound_s(decode_s: float, chains: list[float]) -> float:
    """The larger of the step's tokens decoded with no env latency and its longest chain."""
    return max(decode_s, max(chains, default=0.0))


def ratios(lockstep: float, asynchronous: float, bound: float) -> dict[str, float]:
    return {"async_over_lockstep": asynchronous / lockstep, "async_over_bound": asynchronous / bound}


def steps_per_hour(elapsed_s: list[float]) -> float:
    """Steps an hour from the wall clock at the end of each step (the first step's end is the
    start: it compiles)."""
    if len(elapsed_s) < 2:
        raise ValueError("steps per hour needs at least two steps")
    return 3600.0 * (len(elapsed_s) - 1) / (elapsed_s[-1] - elapsed_s[0])


# ----------------------------------------------------------------------------- runs


def latency_kwargs(args, scale: float = 1.0) -> dict:
    return {"median_ms": args.latency_ms * scale, "p99_ms": args.latency_p99_ms * scale,
            "min_turns": args.turns[0], "max_turns": args.turns[1]}


# A temporary folder for one run's outputs, removed when the block ends (also on error).
scratch_dir = functools.partial(tempfile.TemporaryDirectory, ignore_cleanup_errors=True)


def config(args, out_dir: str, scale: float = 1.0):
    """The run's config: a tiny random Qwen3 (the real vocabulary), one step of `rows` episodes."""
    from jaxscaffold import config as config_lib
    c = config_lib.load_file(os.path.join(ROOT, "configs", "base.py"))
    c.out_dir = out_dir
    c.model.preset = "tiny"
    c.model.compute_dtype = c.model.cache_dtype = "float32"
    c.model.remat_policy = "none"
    c.model.vocabulary = "rooms" if args.vocabulary == "words" else ""
    c.rollout.group_size = args.group_size
    c.rollout.tasks_per_step = args.rows // args.group_size
    c.rollout.max_new_tokens = args.max_new_tokens
    c.rollout.enable_thinking = False
    c.feedback.schedule = "none"
    c.eval.every = 0
    c.envs.num_workers = args.workers
    if args.admit_wait_ms is not None:
        c.rollout.admit_wait_ms = args.admit_wait_ms
    c.envs.train_split = "train"
    if args.env == "latency":
        c.envs.train = "latency"
        c.envs.eval = "latency:test:1"
        c.envs.env_kwargs = json.dumps({"latency": latency_kwargs(args, scale)})
        c.rollout.max_turns = args.turns[1]
        c.rollout.max_len = 128 + args.turns[1] * (args.max_new_tokens + 32)  # system + each turn's action and reply
    else:
        c.envs.train = c.envs.eval = "sciworld"
        c.rollout.max_turns = args.max_turns
        c.rollout.max_len = 1024 + args.max_turns * (args.max_new_tokens + 160)
    c.eval.max_turns = c.rollout.max_turns
    return c


def with_driver(job, lockstep: bool):
    """The job with `rollout.lockstep` set (the same sampler and compiled programs)."""
    cfg = dataclasses.replace(job.cfg, rollout=dataclasses.replace(job.cfg.rollout, lockstep=lockstep))
    return dataclasses.replace(job, cfg=cfg)


@dataclasses.dataclass
class Rollout:
    wall_s: float
    episodes: list
    stats: dict
    compile_s: float = 0.0  # of wall_s: XLA compiling programs this run met first
    prefill: dict = dataclasses.field(default_factory=dict)  # the sampler's prefill calls, rows and work in this run

    @property
    def turns(self) -> int:
        return max((len(e.actions) for e in self.episodes), default=0)


class TimedCalls:
    """An env batch that records the wall time and episode count of each blocking `reset` /
    `step` call (the lock-step driver's), passing everything else through."""

    def __init__(self, envs):
        self.envs, self.calls = envs, []

    def _timed(self, fn, items):
        t = time.perf_counter()
        out = fn(items)
        self.calls.append((time.perf_counter() - t, len(items)))
        return out

    def reset(self, tasks):
        return self._timed(self.envs.reset, tasks)

    def step(self, actions):
        return self._timed(self.envs.step, actions)

    def __getattr__(self, name):
        return getattr(self.envs, name)


def own_seconds_per_call(calls: list[tuple[float, int]], workers: int) -> float:
    """An env's own seconds per reset or step, from lock-step calls of n episodes on `workers`
    workers that each serve their share one after the other: sum(wall x min(workers, n)) / sum(n).
    An env whose instances run concurrently in a worker (`EnvSpec.concurrent`) serves every
    episode at once: pass the episode count as `workers`."""
    episodes = sum(n for _, n in calls)
    return sum(dt * min(workers, n) for dt, n in calls) / episodes if episodes else 0.0


class CompileSeconds:
    """Seconds XLA spends compiling while the block runs (JAX's backend-compile events)."""

    EVENT = "backend_compile_duration"  # the last part of jax.monitoring's event name

    def __init__(self):
        self.seconds = 0.0

    def __call__(self, event: str, duration_s: float, **_) -> None:
        if event.rsplit("/", 1)[-1] == self.EVENT:
            self.seconds += duration_s

    def __enter__(self) -> "CompileSeconds":
        import jax.monitoring
        jax.monitoring.register_event_duration_secs_listener(self)
        return self

    def __exit__(self, *exc) -> None:
        import jax.monitoring
        jax.monitoring.unregister_event_duration_listener(self)


def collect(work, job, params, state: dict, *, lockstep: bool) -> Rollout:
    """One step's rollouts from the workload's saved task-stream state (the same tasks each time)."""
    work.set_state(state)
    before = dict(job.sampler.prefill_counts)
    with CompileSeconds() as compiling:
        t = time.perf_counter()
        episodes, stats = work.collect(with_driver(job, lockstep), params, 1)
        wall = time.perf_counter() - t
    prefill = {f"prefill_{k}": n - before[k] for k, n in job.sampler.prefill_counts.items()}
    return Rollout(wall, episodes, stats, compiling.seconds, prefill)


def compile_sampler(job, params) -> None:
    """After the warm-up runs: compiles every program the step's sampler may run on the rows
    they met, in any grouping (`Sampler.compile_programs(shapes=Sampler.shapes_met)`: every
    row bucket for each width and window met), so that the timed runs compile nothing whichever
    rows share a call as the envs' answers come back."""
    from jaxscaffold.train.multihost import sampler_params

    sampler = job.sampler
    # the parameters as the rollouts get them (`EnvWorkload.collect`): a program's key includes
    # its arguments' placement (a mesh-less sampler's: one device's arrays, not the job's mesh)
    params = sampler.prepare(sampler_params(params, sampler))
    with CompileSeconds() as compiling:
        t = time.perf_counter()
        n = sampler.compile_programs(params, sampler.init_state(), shapes=sampler.shapes_met)
    REPORT.figure("compile_ahead_s", time.perf_counter() - t, "s",
                  fields={"programs": n, "xla_compile_s": round(compiling.seconds, 3)})


def rollouts(args) -> None:
    """The three timed rollouts and their figures; the run's folder is removed at the end."""
    with scratch_dir("bench-rollout-") as out:
        _rollouts(args, out)


def _rollouts(args, out: str) -> None:
    from jaxscaffold import config as config_lib
    from jaxscaffold.envs import latency, registry
    from jaxscaffold.train.job import build_job
    from jaxscaffold.train.workloads.env_rl import EnvWorkload

    cfg = config_lib.typed(config(args, out))
    job, state = build_job(cfg)
    params = job.policy_params(state.params)
    REPORT.say(f"# rollout: tiny model ({args.vocabulary} vocabulary), {args.env}, {args.rows} rows ({args.rows // args.group_size} groups of "
               f"{args.group_size}), {args.max_new_tokens} tokens a turn, {args.workers} env workers"
               + (f", step latency median {args.latency_ms:g} ms p99 {args.latency_p99_ms:g} ms, turns "
                  f"{args.turns[0]}-{args.turns[1]}" if args.env == "latency" else ""))
    work = EnvWorkload(job, params)
    zero = None
    try:
        start = work.get_state()
        drivers = {"lockstep": True, "async": False}
        if args.env == "latency":
            zero = EnvWorkload(dataclasses.replace(job, cfg=config_lib.typed(config(args, out, scale=0.0))), params)
            for lockstep in drivers.values():  # compiles each driver's programs
                collect(zero, job, params, start, lockstep=lockstep)
            free = {name: collect(zero, job, params, start, lockstep=lockstep) for name, lockstep in drivers.items()}
            work.envs.reset(latency.catalogue("train", args.rows))  # starts the workers' envs
        else:
            for _ in range(2):  # compiles, starts every env (JVMs), and warms them (as before the shapes were compiled)
                for lockstep in drivers.values():
                    collect(work, job, params, start, lockstep=lockstep)
        compile_sampler(job, params)
        pool, clock = work.envs, TimedCalls(work.envs)
        work.envs = clock  # the lock-step run's env calls, timed (the bound's env seconds on sciworld)
        try:
            runs = {"lockstep": collect(work, job, params, start, lockstep=True)}
        finally:
            work.envs = pool
        runs.update({name: collect(work, job, params, start, lockstep=lockstep)
                     for name, lockstep in drivers.items() if not lockstep})
    finally:
        work.close()
        if zero is not None:
            zero.close()
    lock = runs["lockstep"]
    busy = lock.stats.get("time/decode_s", 0.0) + lock.stats.get("time/prefill_s", 0.0)
    if args.env == "latency":
        decode = min(r.wall_s for r in free.values())
        turn = free["lockstep"].wall_s / max(free["lockstep"].turns, 1)
        kw = latency_kwargs(args)
        chains = [chain_s(len(e.actions), sum(latency.draws(e.task.seed, e.actions, median_ms=kw["median_ms"],
                                                            p99_ms=kw["p99_ms"], min_turns=kw["min_turns"],
                                                            max_turns=kw["max_turns"])[1]), turn)
                  for e in lock.episodes if e.failure is None]
    else:
        decode = busy
        turn = busy / max(lock.turns, 1)
        concurrent = registry.spec(args.env).concurrent  # a worker's instances step at once
        per_call = own_seconds_per_call(clock.calls, len(lock.episodes) if concurrent else args.workers)
        chains = [chain_s(len(e.actions), per_call * (len(e.actions) + 1), turn)  # + 1: its reset
                  for e in lock.episodes if e.failure is None]
    bound = bound_s(decode, chains)
    failures = sum(e.failure is not None for r in runs.values() for e in r.episodes)
    info = {"episodes": len(lock.episodes), "failures": failures, "lockstep_turns": lock.turns,
            "mean_turns": statistics.mean(len(e.actions) for e in lock.episodes),
            **split(lock.stats), "compile_s": round(lock.compile_s, 3), **lock.prefill}
    REPORT.figure("lockstep_s", lock.wall_s, "s", fields=info)
    REPORT.figure("bound_s", bound, "s", fields={"decode_s": round(decode, 3), "longest_chain_s": round(max(chains), 3),
                                                "turn_s": round(turn, 4)})
    if "async" in runs:
        a = runs["async"]
        r = ratios(lock.wall_s, a.wall_s, bound)
        REPORT.figure("async_s", a.wall_s, "s", fields={**split(a.stats), "compile_s": round(a.compile_s, 3), **a.prefill,
                                                        "same_actions": same_actions(lock.episodes, a.episodes)})
        REPORT.figure("async_over_lockstep", r["async_over_lockstep"], "ratio", note="goal <= 0.4")
        REPORT.figure("async_over_bound", r["async_over_bound"], "ratio", note="goal <= 1.25")


def split(stats: dict) -> dict[str, float]:
    """A run's decode, prefill and env seconds (`Timings`, env summed over episodes) and its
    accelerator idle share."""
    return {k.replace("time/", "").replace("rollout_", ""): round(stats.get(k, 0.0), 3)
            for k in ("time/decode_s", "time/prefill_s", "time/env_s", "time/rollout_idle_share")}


def same_actions(a: list, b: list) -> float:
    """The share of episodes (matched by task and group order) whose actions are equal."""
    key = lambda eps: sorted(((e.group, e.task.task_id), i) for i, e in enumerate(eps))  # noqa: E731
    pairs = list(zip(key(a), key(b)))
    return sum(a[i].actions == b[j].actions for (_, i), (_, j) in pairs) / max(len(pairs), 1)


def training_steps(args) -> None:
    """S whole training steps through the trainer, synchronous vs asynchronous with staleness K."""
    from jaxscaffold.train.trainer import train

    per_hour = {}
    for name, lockstep, staleness in (("sync", True, 0), ("async", False, args.staleness)):
        with scratch_dir(f"bench-steps-{name}-") as out:
            c = config(args, out)
            c.steps = args.steps
            c.checkpoint.every = args.steps + 1
            c.memory.check_at_start = False
            c.rollout.max_staleness = staleness
            c.rollout.lockstep = lockstep
            train(c)
            with open(os.path.join(out, "metrics.jsonl")) as f:
                rows = [json.loads(line) for line in f]
        per_hour[name] = steps_per_hour([r["time/elapsed_s"] for r in rows if r.get("step", 0) >= 1])
    REPORT.figure("steps_per_hour_sync", per_hour["sync"], "steps/h")
    REPORT.figure("steps_per_hour_async", per_hour["async"], "steps/h", per_hour["async"] / per_hour["sync"],
                  note=f"staleness {args.staleness}")


def run(quick: bool = False, argv=()) -> None:
    args = parse_args(argv, quick)
    rollouts(args)
    if args.steps:
        training_steps(args)
