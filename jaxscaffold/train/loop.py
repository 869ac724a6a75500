"""The training loop: the one place that wires model, sampler, environments, feedback and RL.

  tasks (grain, checkpointable) -> rollouts (sampler + envs + feedback schedule)
  -> rewards -> advantages (+ DAPO dynamic sampling) -> train steps
  -> every N steps: greedy evaluation on held-out tasks in the standard env -> checkpoints

`train(config)` runs a whole job from an ml_collections config (see `configs/`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import time
from typing import Any, Callable, Sequence

import grain
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from jaxscaffold.buckets import pow2_bucket
from jaxscaffold.envs import registry
from jaxscaffold.envs.base import Task
from jaxscaffold.envs.pool import EnvPool
from jaxscaffold.feedback import bandit as bandit_lib
from jaxscaffold.feedback import enrichers as enrichers_lib
from jaxscaffold.feedback import schedule as schedule_lib
from jaxscaffold.models import config as model_config_lib
from jaxscaffold.models import hf_io, qwen3
from jaxscaffold.models.sharding import MeshConfig, make_mesh, maybe_initialize_distributed, shard_batch
from jaxscaffold.models.tokenizer import load_tokenizer
from jaxscaffold.rl import dapo
from jaxscaffold.rl.advantages import advantages, informative
from jaxscaffold.rl.presets import preset
from jaxscaffold.rl.train_step import OptimizerConfig, init_train_state, make_train_step, state_shardings
from jaxscaffold.rollout.engine import Sampler
from jaxscaffold.rollout.sampling import GREEDY, SamplingConfig
from jaxscaffold.train.batching import build_batch
from jaxscaffold.train.checkpoint import Checkpointer
from jaxscaffold.train.logger import MetricLogger, StepLog
from jaxscaffold.train.rollouts import Episode, LocalEnvs, RolloutConfig, run_episodes

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- set-up


def build_model(cfg, mesh):
    """(model config, params) from an HF directory, or a random init of a preset."""
    m = cfg.model
    execution = dict(compute_dtype=m.compute_dtype, scan_layers=m.scan_layers, remat_policy=m.remat_policy)
    if m.hf_path:
        return hf_io.load_pretrained(m.hf_path, dtype=m.param_dtype, mesh=mesh, **execution)
    if m.preset == "tiny":
        config = model_config_lib.tiny(param_dtype=m.param_dtype, **execution)
    else:
        config = model_config_lib.preset(m.preset, param_dtype=m.param_dtype, **execution)
    return config, qwen3.init_params(config, jax.random.key(cfg.seed), mesh=mesh)


def _tokenizer_path(m) -> str | None:
    """The configured tokenizer dir; else the checkpoint's own, if it has one; else None (offline)."""
    if m.tokenizer:
        return m.tokenizer
    if m.hf_path and os.path.exists(os.path.join(m.hf_path, "tokenizer_config.json")):
        return m.hf_path
    return None


class TaskStream:
    """An endless, shuffled, checkpointable stream of tasks (grain) over several envs."""

    def __init__(self, tasks: list[Task], seed: int):
        if not tasks:
            raise ValueError("no training tasks: check config.envs")
        self.tasks = tasks
        index = grain.MapDataset.range(len(tasks)).shuffle(seed=seed).repeat(None)
        # Indices need no read-ahead: grain's default prefetches 500 of them on 16 threads,
        # which only contend for the GIL with the rollouts (same order, same state format).
        self._it = iter(index.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))

    def take(self, n: int) -> list[Task]:
        return [self.tasks[int(next(self._it))] for _ in range(n)]

    def get_state(self) -> dict:
        return self._it.get_state()

    def set_state(self, state: dict) -> None:
        self._it.set_state(state)


def rollout_config(c, max_turns: int) -> RolloutConfig:
    """The rollout options of `config.rollout` (train and eval differ only in max_turns)."""
    return RolloutConfig(max_turns=max_turns, max_new_tokens=c.max_new_tokens, enable_thinking=c.enable_thinking,
                         representation=c.get("representation", "trajectory"),
                         history_window=c.get("history_window", 2))


def env_kwargs(cfg) -> dict[str, dict]:
    """`config.envs.env_kwargs`: JSON {env name: constructor kwargs}, e.g. tau2's user endpoint."""
    text = cfg.envs.get("env_kwargs", "") or ""
    try:
        out = json.loads(text) if text else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"config.envs.env_kwargs is not JSON ({e}): {text!r}") from e
    if not isinstance(out, dict) or not all(isinstance(v, dict) for v in out.values()):
        raise ValueError(f"config.envs.env_kwargs must map env names to kwargs objects: {text!r}")
    return out


def make_envs(cfg, names):
    """The environments of a run: the process pool (`envs.num_workers` > 0) or in-process."""
    kwargs = env_kwargs(cfg)
    if cfg.envs.num_workers > 0:
        return EnvPool(cfg.envs.num_workers, step_timeout_s=cfg.envs.step_timeout_s, env_kwargs=kwargs)
    return LocalEnvs({n: registry.factory(n, **kwargs.get(n, {})) for n in names})


def env_names(spec: str) -> list[str]:
    """"sciworld,bfcl:validation" -> ["sciworld", "bfcl"]."""
    return [n.split(":")[0].strip() for n in spec.split(",") if n.strip()]


def _tasks(names: str, split: str, limit: int | None = None) -> list[Task]:
    """Tasks of every env in `names`: "env", "env:split" to override the split, "env:split:n"
    (split may be empty, "env::n") for its first n tasks instead of `limit`."""
    out = []
    for entry in [n.strip() for n in names.split(",") if n.strip()]:
        name, own_split, own_limit = (entry.split(":") + ["", ""])[:3]
        cat = registry.catalogue(name.strip(), own_split.strip() or split)
        n = int(own_limit) if own_limit.strip() else limit
        out += cat[:n] if n else cat
    return out


# ----------------------------------------------------------------------------- processes
#
# On several processes (multi-host) each runs its share of the step's groups with a
# process-local copy of the parameters; the task stream, the feedback decisions and the bandit
# are functions of the run seed and the step, so they agree everywhere; what needs the global
# view (metrics, the feedback log, the bandit's signal) is gathered from every process.


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


def _sampler_params(params):
    """The parameters rollouts sample with. Replicated parameters: one device's replica, so the
    sampler runs on one device instead of repeating the same work (and memory) on every
    device of the mesh. Sharded ones: as they are on one process (the sampler runs SPMD over
    the mesh); on several processes gathered onto this process's devices (a collective), as a
    jitted call on arrays spanning processes would need every process at once, and rollouts
    run on each process separately."""
    leaves, treedef = jax.tree.flatten(params)
    sharded = [i for i, x in enumerate(leaves) if not x.is_fully_replicated]
    if sharded and jax.process_count() == 1:
        return params
    gathered = multihost_utils.process_allgather([leaves[i] for i in sharded], tiled=True) if sharded else []
    out = [None if i in sharded else x.addressable_data(0) for i, x in enumerate(leaves)]
    for i, g in zip(sharded, gathered):
        out[i] = jnp.asarray(g)
    return jax.tree.unflatten(treedef, out)


# ----------------------------------------------------------------------------- one step


def _group_stats(episodes: list[Episode]) -> dict[int, list[Episode]]:
    groups: dict[int, list[Episode]] = {}
    for ep in episodes:
        if ep.failure is None:
            groups.setdefault(ep.group, []).append(ep)
    return groups


def episode_summaries(episodes: Sequence[Episode]) -> list[dict]:
    """What metrics and the feedback log need of each episode, as JSON (sent between processes)."""
    out, seen = [], {}
    for e in episodes:
        rollout = seen[e.group] = seen.get(e.group, -1) + 1  # the episode's index in its group
        out.append({"group": e.group, "rollout": rollout, "task": e.task.task_id, "env": e.task.env,
                    "failed": e.failure is not None, "reward": float(e.reward), "won": bool(e.won),
                    "steps": e.steps, "truncated": bool(e.truncated),
                    "response_tokens": int(sum(sum(c.assistant_mask) for c in e.training_rows())),
                    "feedback": [[int(s), k] for s, k in e.feedback]})
    return out


def summary_metrics(summaries: Sequence[dict], prefix: str) -> dict[str, float]:
    """`rollout_metrics` of episode summaries (see `episode_summaries`)."""
    ok = [e for e in summaries if not e["failed"]]
    out = {f"{prefix}/infra_failures": float(len(summaries) - len(ok))}
    if not ok:
        return out
    out[f"{prefix}/reward"] = float(np.mean([e["reward"] for e in ok]))
    out[f"{prefix}/success"] = float(np.mean([e["won"] for e in ok]))
    out[f"{prefix}/env_steps"] = float(np.mean([e["steps"] for e in ok]))
    out[f"{prefix}/response_tokens"] = float(np.mean([e["response_tokens"] for e in ok]))
    out[f"{prefix}/truncated"] = float(np.mean([e["truncated"] for e in ok]))
    for env in sorted({e["env"] for e in ok}):
        sub = [e for e in ok if e["env"] == env]
        out[f"{prefix}/success_{env}"] = float(np.mean([e["won"] for e in sub]))
    for kind in schedule_lib.KINDS:
        # Enrichments (one per episode step that got `kind`), and the groups that got any.
        out[f"{prefix}/feedback_{kind}"] = float(sum(k == kind for e in ok for _, k in e["feedback"]))
        out[f"{prefix}/feedback_groups_{kind}"] = float(len({e["group"] for e in ok
                                                             if any(k == kind for _, k in e["feedback"])}))
    return out


def rollout_metrics(episodes: list[Episode], prefix: str, *, across_processes: bool = False) -> dict[str, float]:
    """Success, reward, lengths, per-env success and feedback counts of `episodes`.
    `across_processes`: over every process's episodes (a collective), the same on every host."""
    summaries = episode_summaries(episodes)
    if across_processes:
        summaries = [s for part in allgather_json(summaries) for s in part]
    return summary_metrics(summaries, prefix)


def informative_share(summaries: Sequence[dict]) -> float:
    """The share of groups whose rewards are not all equal (GRPO learns only from those).
    On rewards, not successes: a shaped or continuous reward can make a group informative."""
    groups: dict[int, list[float]] = {}
    for e in summaries:
        if not e["failed"]:
            groups.setdefault(e["group"], []).append(e["reward"])
    return float(np.mean([informative(r) for r in groups.values()])) if groups else 0.0


@dataclasses.dataclass
class Job:
    """The model side of a run, built once from the config: what every workload trains with."""

    cfg: Any
    mesh: Any
    model_config: Any
    tokenizer: Any
    sampler: Sampler  # training rollouts (temperature, group rows)
    eval_sampler: Sampler  # greedy evaluation
    train_step: Any
    algo: Any
    row_multiple: int
    ref_params: Any = None  # frozen reference policy (the initial parameters) when kl_coef > 0


class EnvWorkload:
    """Task RL on environments: what a step collects (rollouts with the feedback schedule) and
    how it is evaluated (greedy, held-out tasks, the standard env).

    `feedback.schedule = "bandit"` learns the schedule: every training step a Thompson-sampling
    bandit over `feedback.bandit_arms` picks one arm (a schedule name) for all groups, from the
    run seed and the step; after the rollouts its posterior is updated with the step's
    learning signal. Every enrichment is appended to `out_dir/feedback.jsonl`.
    """

    def __init__(self, job: Job, params=None):
        cfg = job.cfg
        if cfg.rollout.tasks_per_step < jax.process_count():
            raise ValueError(f"rollout.tasks_per_step={cfg.rollout.tasks_per_step} gives some of the "
                             f"{jax.process_count()} processes no group to run")
        names = set(env_names(cfg.envs.train) + env_names(cfg.envs.eval))
        self.envs = make_envs(cfg, names)
        f = cfg.feedback
        self.seed, self.signal, self.bandit = cfg.seed, f.bandit_signal, None
        if f.schedule == "bandit":
            arms = [a.strip() for a in f.bandit_arms.split(",") if a.strip()]
            self.schedules = {a: schedule_lib.make(a, p=f.probability, switch=f.switch_step) for a in arms}
            self.bandit = bandit_lib.BanditState.create(arms, discount=f.bandit_discount, prior=f.bandit_prior)
            if f.bandit_signal not in ("informative", "success"):
                raise ValueError(f"unknown feedback.bandit_signal {f.bandit_signal!r}; known: informative, success")
        else:
            self.schedule = schedule_lib.make(f.schedule, p=f.probability, switch=f.switch_step)
        self.stream = TaskStream(_tasks(cfg.envs.train, cfg.envs.train_split), seed=cfg.seed)
        self.eval_tasks = _tasks(cfg.envs.eval, cfg.envs.eval_split, limit=cfg.eval.tasks)
        forms = {"ag": f.ag_form, "oe": f.oe_form}
        self.enrichers = {n: e for n in names if (e := enrichers_lib.enricher(n, forms)) is not None}
        self.feedback_log = StepLog(os.path.join(cfg.out_dir, "feedback.jsonl"), write=jax.process_index() == 0)

    def schedule_at(self, step: int) -> schedule_lib.Schedule:
        """The feedback schedule of a training step: the fixed one, or the bandit's arm."""
        if self.bandit is None:
            return self.schedule
        arm = bandit_lib.choose(self.bandit, run_seed=self.seed, train_step=step, group_id=0)
        return self.schedules[arm]

    def collect(self, job: Job, params, step: int) -> tuple[list[Episode], dict]:
        """Rollouts for one train step; DAPO's dynamic sampling keeps generating until enough
        groups have mixed binary success (or raises after max_num_gen_batches).

        On several processes each runs its share of the step's groups (`process_share`; the
        task stream is the same on every process) and returns its own episodes, whole groups,
        to train on; the metrics, the feedback log and the bandit see every process's."""
        cfg, c = job.cfg, job.cfg.rollout
        rcfg = rollout_config(c, c.max_turns)
        schedule = self.schedule_at(step)
        params = _sampler_params(params)
        share = process_share(c.tasks_per_step)
        dynamic = dapo.DynamicSampler(len(share), None) if job.algo.dynamic_sampling else None
        limit = job.algo.max_num_gen_batches if dynamic else 1
        generated: list[dict] = []  # every process's episodes of every generation batch
        batches = 0
        for batch_index in itertools.count() if limit is None or limit <= 0 else range(limit):
            tasks = self.stream.take(c.tasks_per_step)  # every process takes them: streams stay equal
            mine = [] if dynamic is not None and dynamic.full() else list(share)
            flat = [tasks[g] for g in mine for _ in range(c.group_size)]
            groups = [g for g in mine for _ in range(c.group_size)]
            episode_ids = [g * c.group_size + r for g in mine for r in range(c.group_size)]
            episodes = run_episodes(params, job.sampler, self.envs, job.tokenizer, flat, groups, rcfg,
                                    seed=cfg.seed + 7919 * batch_index, train_step=step, episode_ids=episode_ids,
                                    schedule=schedule, randomization_mode=cfg.feedback.mode,
                                    num_groups=len(tasks), enrichers=self.enrichers) if flat else []
            for e in episodes:  # groups of different generation batches stay apart
                e.group += batch_index * c.tasks_per_step
            batches += 1
            if dynamic is not None and episodes:
                # DAPO filters on binary success (`won`), as the reference does, not on the reward.
                grouped = _group_stats(episodes)
                dynamic.add([np.asarray([float(e.won) for e in eps]) for eps in grouped.values()],
                            payloads=list(grouped.values()))
            parts = allgather_json({"episodes": episode_summaries(episodes),
                                    "full": dynamic is None or dynamic.full()})
            generated += [s for part in parts for s in part["episodes"]]
            if all(part["full"] for part in parts):
                break
        else:
            raise dapo.DynamicSamplingExhausted(
                f"dynamic sampling did not collect {c.tasks_per_step} groups with mixed success in "
                f"{batches} generation batches (rl.algorithm={job.algo.name}, max_num_gen_batches={limit}); "
                f"{informative_share(generated):.0%} of the groups had unequal rewards")
        stats = {"rollout/generation_batches": float(batches),
                 "rollout/informative_groups": informative_share(generated)}
        if dynamic is None:
            kept, kept_summaries = episodes, generated
        else:
            taken = dynamic.take()
            kept = [e for eps in taken.payloads for e in eps]
            parts = allgather_json({"kept": episode_summaries(kept), "dropped": taken.num_dropped,
                                    "overflow": taken.num_overflow})
            kept_summaries = [s for part in parts for s in part["kept"]]
            stats["rollout/dropped_groups"] = float(sum(part["dropped"] for part in parts))
            stats["rollout/overflow_groups"] = float(sum(part["overflow"] for part in parts))
        stats.update(summary_metrics(kept_summaries, "rollout"))
        if self.bandit is not None:
            stats.update(self._learn_schedule(schedule.name, generated))
        kept_groups = {e["group"] for e in kept_summaries}
        self.feedback_log.write(step, [
            {"step": step, "group": e["group"], "rollout": e["rollout"], "task": e["task"], "env": e["env"],
             "episode_step": s, "kind": k, "schedule": schedule.name, "kept": e["group"] in kept_groups}
            for e in generated for s, k in e["feedback"]])
        return kept, stats

    def _learn_schedule(self, arm: str, generated: list[dict]) -> dict:
        """Updates the bandit with the step's learning signal (of every generated group, also
        those DAPO dropped: the signal is how many groups feedback made informative)."""
        if self.signal == "informative":
            signal = informative_share(generated)
        else:
            ok = [e["won"] for e in generated if not e["failed"]]
            signal = float(np.mean(ok)) if ok else 0.0
        self.bandit = bandit_lib.update(self.bandit, [(arm, signal)])
        out = {"feedback/arm": arm, "feedback/arm_index": float(self.bandit.arms.index(arm)),
               "feedback/signal": signal}
        for name, value in zip(self.bandit.arms, self.bandit.means()):
            out[f"feedback/value_{name}"] = float(value)
        return out

    def evaluate_episodes(self, job: Job, params, step: int) -> list[Episode]:
        """Greedy, group 1, held-out tasks, the standard environment (no feedback schedule).
        On several processes each runs (and returns) its share of the tasks."""
        c = job.cfg.rollout
        rcfg = rollout_config(c, job.cfg.eval.max_turns)
        params = _sampler_params(params)
        tasks = [self.eval_tasks[i] for i in process_share(len(self.eval_tasks))]
        episodes = []
        n = job.eval_sampler.batch_size
        for start in range(0, len(tasks), n):
            chunk = tasks[start:start + n]
            episodes += run_episodes(params, job.eval_sampler, self.envs, job.tokenizer, chunk,
                                     list(range(len(chunk))), rcfg, seed=job.cfg.seed + 1000, train_step=step,
                                     schedule=None)
        return episodes

    def evaluate(self, job: Job, params, step: int) -> dict[str, float]:
        return rollout_metrics(self.evaluate_episodes(job, params, step), "eval", across_processes=True)

    def get_state(self) -> dict:
        state = {"data": self.stream.get_state()}
        if self.bandit is not None:
            state["bandit"] = self.bandit.to_dict()
        return state

    def set_state(self, state: dict) -> None:
        self.stream.set_state(state["data"])
        if self.bandit is not None and "bandit" in state:
            self.bandit = bandit_lib.BanditState.from_dict(state["bandit"])

    def close(self) -> None:
        self.envs.close()


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


def train_on(job: Job, state, episodes: list[Episode]):
    """Advantages over groups, then ppo_epochs x num_minibatches optimizer steps.

    On several processes `episodes` are this process's (whole groups, so advantages stay
    local); each process feeds its rows and every optimizer step trains on the global batch."""
    ok = [e for e in episodes if e.failure is None and e.training_rows()]
    rewards, penalty = shaped_rewards(ok, job.algo, job.cfg.rollout.max_new_tokens)
    group_ids = np.asarray([e.group for e in ok])
    adv = advantages(rewards, group_ids, **job.algo.advantage_kwargs())
    # One row per trajectory, or (step-wise) one per model turn sharing its episode's advantage.
    rows = [(conv, a) for e, a in zip(ok, adv) for conv in e.training_rows()]
    r = job.cfg.rl
    metrics = {}
    order = np.arange(len(rows))
    for _ in range(r.ppo_epochs):
        for mb in np.array_split(order, r.num_minibatches):
            batch = process_batch([rows[i][0] for i in mb], np.asarray([rows[i][1] for i in mb]), job.row_multiple)
            if job.mesh is not None:
                batch = shard_batch(batch, job.mesh)
            state, m = job.train_step(state, batch, *(() if job.ref_params is None else (job.ref_params,)))
            metrics = {k: float(v) for k, v in jax.device_get(m).items()}
    if job.algo.overlong_buffer:
        metrics["overlong_penalty"] = float(penalty.mean()) if len(penalty) else 0.0
    return state, {f"train/{k}": v for k, v in metrics.items()}


def turn_lengths(conv) -> list[int]:
    """Tokens of each model turn of a conversation (the runs of its assistant mask)."""
    out, run = [], 0
    for m in list(conv.assistant_mask) + [0]:
        if m:
            run += 1
        elif run:
            out.append(run)
            run = 0
    return out


def shaped_rewards(episodes: Sequence[Episode], algo, max_new_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(reward + DAPO's overlong penalty, the penalty) per episode. The penalty counts the
    longest model turn against the per-turn budget `max_new_tokens` (the length a turn is cut
    at); the buffer is capped at that budget so short-turn configs keep a valid shaping."""
    rewards = np.asarray([e.reward for e in episodes], np.float64)
    if not algo.overlong_buffer:
        return rewards, np.zeros_like(rewards)
    longest = [max((n for c in e.training_rows() for n in turn_lengths(c)), default=0) for e in episodes]
    penalty = dapo.overlong_penalty(longest, max_new_tokens, min(algo.overlong_buffer, max_new_tokens),
                                    algo.overlong_factor)
    return rewards + penalty, penalty


# ----------------------------------------------------------------------------- the job


def mesh_devices(cfg) -> list | None:
    """`config.mesh.devices`: the first n devices (None: all of them)."""
    n = cfg.mesh.get("devices", 0)
    if not n or n == jax.device_count():
        return None
    if jax.process_count() > 1 or not 0 < n <= jax.device_count():
        raise ValueError(f"config.mesh.devices={n}: a subset of the devices needs 1 <= n <= "
                         f"{jax.device_count()} and one process (have {jax.process_count()})")
    return jax.devices()[:n]


def _job(cfg) -> tuple[Job, Any]:
    maybe_initialize_distributed()
    mesh = make_mesh(MeshConfig(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor), mesh_devices(cfg))
    model_config, params = build_model(cfg, mesh)
    tokenizer = load_tokenizer(_tokenizer_path(cfg.model))
    r, c = cfg.rl, cfg.rollout
    algo = preset(r.algorithm, kl_coef=r.kl_coef, entropy_coef=r.entropy_coef)
    opt_config = OptimizerConfig(lr=r.lr, weight_decay=r.weight_decay, grad_clip=r.grad_clip,
                                 warmup_steps=r.warmup_steps)
    opt = opt_config.make()
    data_parallel = mesh.shape["data"] * mesh.shape["fsdp"]
    with_reference = bool(algo.kl_coef)
    # The config (not `opt`) names the optimizer: equal configs share the compiled step.
    step_fn = make_train_step(model_config, algo, opt_config, num_micro_batches=r.micro_batches, mesh=mesh,
                              agg_constant=float(c.max_new_tokens * c.max_turns), with_reference=with_reference)
    shardings = state_shardings(model_config, opt, mesh)
    # The reference is a copy (the state's parameters are donated to each step).
    ref_params = jax.tree.map(jnp.copy, params) if with_reference else None
    state = jax.device_put(init_train_state(params, opt), shardings)
    sampling = SamplingConfig(temperature=c.temperature, top_p=c.top_p)
    # Slots for this process's share of the groups and eval tasks (all of them on one process).
    share = -(-c.tasks_per_step // jax.process_count())
    rows = share * c.group_size
    sampler = Sampler(model_config, batch_size=rows, max_len=c.max_len, sampling=sampling,
                      cache_dtype=cfg.model.cache_dtype)
    eval_rows = min(rows, max(1, -(-cfg.eval.tasks // jax.process_count())))
    eval_sampler = Sampler(model_config, batch_size=eval_rows, max_len=cfg.eval.get("max_len") or c.max_len,
                           sampling=GREEDY, cache_dtype=cfg.model.cache_dtype)
    job = Job(cfg, mesh, model_config, tokenizer, sampler, eval_sampler, step_fn, algo,
              row_multiple=r.micro_batches * data_parallel, ref_params=ref_params)
    return job, state


def train(cfg, workload: Callable[[Job, Any], Any] = EnvWorkload) -> dict[str, Any]:
    """Runs (or resumes) the job described by `cfg`; returns the final metrics and history.

    Multi-host: every process runs `train(cfg)` (JAX's multi-controller runtime starts from the
    environment, see `maybe_initialize_distributed`); each runs its share of the rollouts and
    feeds its rows of the global batch; process 0 writes the logs.

    `workload(job, initial_params)` builds what a step collects and how the model is evaluated (default: task
    RL on environments); it has `collect`, `evaluate`, `get_state`, `set_state` and `close`.
    """
    job, state = _job(cfg)
    work = workload(job, state.params)
    out = cfg.out_dir
    os.makedirs(out, exist_ok=True)
    ckpt = Checkpointer(os.path.join(out, "checkpoints"), keep=cfg.checkpoint.keep)
    history: list[dict] = []
    start = 0
    if ckpt.latest_step() is not None:
        state, extra = ckpt.restore(state)
        missing = sorted({"step", "workload", "history"} - set(extra))
        if missing:
            raise ValueError(
                f"the checkpoint in {ckpt.directory} lacks {missing}: it was written by an older, "
                f"incompatible version; resume is impossible, so use a new out_dir (or delete {out})")
        start = extra["step"]
        work.set_state(extra["workload"])
        history = extra["history"]
        log.info("resumed from step %d", start)
    # One process writes the logs (every process holds the same, gathered, metrics).
    logger = MetricLogger(out, total_steps=cfg.steps, start=start, write=jax.process_index() == 0)
    peak = max((h.get("eval/success", -1.0) for h in history), default=-1.0)
    try:
        for step in range(start + 1, cfg.steps + 1):
            t0 = time.perf_counter()
            episodes, stats = work.collect(job, state.params, step)
            t1 = time.perf_counter()
            state, train_metrics = train_on(job, state, episodes)
            t2 = time.perf_counter()
            tokens = sum(allgather_json(sum(len(e.conversation) for e in episodes)))
            metrics = {"step": step, **stats, **train_metrics,
                       "time/rollout_s": t1 - t0, "time/train_s": t2 - t1,
                       "time/tokens_per_s": tokens / max(t2 - t0, 1e-9)}
            if cfg.eval.every and step % cfg.eval.every == 0:
                metrics.update(work.evaluate(job, state.params, step))
                metrics["time/eval_s"] = time.perf_counter() - t2
                peak = max(peak, metrics.get("eval/success", -1.0))
                metrics["eval/success_peak"] = peak
            history.append(metrics)
            logger.log(step, metrics)
            if step % cfg.checkpoint.every == 0 or step == cfg.steps:
                ckpt.save(step, state, {"step": step, "workload": work.get_state(), "history": history,
                                        "config": json.loads(cfg.to_json())})
        ckpt.wait()
    finally:
        ckpt.close()
        work.close()
        logger.close(history)
    return {"history": history, "state": state}
