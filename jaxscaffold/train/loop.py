"""The training loop: the one place that wires model, sampler, environments, feedback and RL.

  tasks (grain, checkpointable) -> rollouts (sampler + envs + feedback schedule)
  -> rewards -> advantages (+ DAPO dynamic sampling) -> train steps
  -> every N steps: greedy evaluation on held-out tasks in the standard env -> checkpoints

`train(config)` runs a whole job from an ml_collections config (see `configs/`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any, Callable

import grain
import jax
import jax.numpy as jnp
import numpy as np

from jaxscaffold.envs import registry
from jaxscaffold.envs.base import Task
from jaxscaffold.envs.pool import EnvPool
from jaxscaffold.feedback import enrichers as enrichers_lib
from jaxscaffold.feedback import schedule as schedule_lib
from jaxscaffold.models import config as model_config_lib
from jaxscaffold.models import hf_io, qwen3
from jaxscaffold.models.sharding import MeshConfig, make_mesh, maybe_initialize_distributed, shard_batch
from jaxscaffold.models.tokenizer import load_tokenizer
from jaxscaffold.rl import dapo
from jaxscaffold.rl.advantages import advantages
from jaxscaffold.rl.presets import preset
from jaxscaffold.rl.train_step import OptimizerConfig, init_train_state, make_train_step, state_shardings
from jaxscaffold.rollout.engine import Sampler
from jaxscaffold.rollout.sampling import GREEDY, SamplingConfig
from jaxscaffold.train.batching import build_batch
from jaxscaffold.train.checkpoint import Checkpointer
from jaxscaffold.train.logger import MetricLogger
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
        self._it = iter(index.to_iter_dataset())

    def take(self, n: int) -> list[Task]:
        return [self.tasks[int(next(self._it))] for _ in range(n)]

    def get_state(self) -> dict:
        return self._it.get_state()

    def set_state(self, state: dict) -> None:
        self._it.set_state(state)


def env_names(spec: str) -> list[str]:
    """"sciworld,bfcl:validation" -> ["sciworld", "bfcl"]."""
    return [n.split(":")[0].strip() for n in spec.split(",") if n.strip()]


def _tasks(names: str, split: str, limit: int | None = None) -> list[Task]:
    """Tasks of every env in `names` ("env" or "env:split" to override the split)."""
    out = []
    for entry in [n.strip() for n in names.split(",") if n.strip()]:
        name, _, own_split = entry.partition(":")
        cat = registry.catalogue(name.strip(), own_split.strip() or split)
        out += cat[:limit] if limit else cat
    return out


# ----------------------------------------------------------------------------- one step


def _group_stats(episodes: list[Episode]) -> dict[int, list[Episode]]:
    groups: dict[int, list[Episode]] = {}
    for ep in episodes:
        if ep.failure is None:
            groups.setdefault(ep.group, []).append(ep)
    return groups


def rollout_metrics(episodes: list[Episode], prefix: str) -> dict[str, float]:
    ok = [e for e in episodes if e.failure is None]
    out = {f"{prefix}/infra_failures": float(len(episodes) - len(ok))}
    if not ok:
        return out
    out[f"{prefix}/reward"] = float(np.mean([e.reward for e in ok]))
    out[f"{prefix}/success"] = float(np.mean([e.won for e in ok]))
    out[f"{prefix}/env_steps"] = float(np.mean([e.steps for e in ok]))
    out[f"{prefix}/response_tokens"] = float(np.mean([sum(e.conversation.assistant_mask) for e in ok]))
    out[f"{prefix}/truncated"] = float(np.mean([e.truncated for e in ok]))
    for env in sorted({e.task.env for e in ok}):
        sub = [e for e in ok if e.task.env == env]
        out[f"{prefix}/success_{env}"] = float(np.mean([e.won for e in sub]))
    for kind in schedule_lib.KINDS:
        out[f"{prefix}/feedback_{kind}"] = float(sum(k == kind for e in ok for _, k in e.feedback))
    return out


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
    how it is evaluated (greedy, held-out tasks, the standard env)."""

    def __init__(self, job: Job, params=None):
        cfg = job.cfg
        names = set(env_names(cfg.envs.train) + env_names(cfg.envs.eval))
        if cfg.envs.num_workers > 0:
            self.envs = EnvPool(cfg.envs.num_workers, step_timeout_s=cfg.envs.step_timeout_s)
        else:
            self.envs = LocalEnvs({n: registry.factory(n) for n in names})
        self.schedule = schedule_lib.make(cfg.feedback.schedule, p=cfg.feedback.probability,
                                          switch=cfg.feedback.switch_step)
        self.stream = TaskStream(_tasks(cfg.envs.train, cfg.envs.train_split), seed=cfg.seed)
        self.eval_tasks = _tasks(cfg.envs.eval, cfg.envs.eval_split, limit=cfg.eval.tasks)
        forms = {"ag": cfg.feedback.ag_form, "oe": cfg.feedback.oe_form}
        self.enrichers = {n: e for n in names if (e := enrichers_lib.enricher(n, forms)) is not None}

    def collect(self, job: Job, params, step: int) -> tuple[list[Episode], dict]:
        """Rollouts for one train step; DAPO's dynamic sampling keeps generating until enough
        groups have mixed binary success (or raises after max_num_gen_batches)."""
        c = job.cfg.rollout
        rcfg = RolloutConfig(max_turns=c.max_turns, max_new_tokens=c.max_new_tokens,
                             enable_thinking=c.enable_thinking)
        dynamic = dapo.DynamicSampler(c.tasks_per_step, job.algo.max_num_gen_batches) \
            if job.algo.dynamic_sampling else None
        kept: list[Episode] = []
        stats = {"rollout/generation_batches": 0.0}
        for batch_index in range(job.algo.max_num_gen_batches if dynamic else 1):
            tasks = self.stream.take(c.tasks_per_step)
            flat = [t for t in tasks for _ in range(c.group_size)]
            groups = [g for g in range(len(tasks)) for _ in range(c.group_size)]
            episodes = run_episodes(params, job.sampler, self.envs, job.tokenizer, flat, groups, rcfg,
                                    seed=job.cfg.seed + 7919 * batch_index, train_step=step,
                                    schedule=self.schedule, randomization_mode=job.cfg.feedback.mode,
                                    num_groups=len(tasks), enrichers=self.enrichers)
            stats["rollout/generation_batches"] += 1
            if dynamic is None:
                return episodes, {**stats, **rollout_metrics(episodes, "rollout")}
            grouped = _group_stats(episodes)
            for eps in grouped.values():  # groups of different generation batches stay apart
                for e in eps:
                    e.group += batch_index * c.tasks_per_step
            dynamic.add([np.asarray([float(e.won) for e in eps]) for eps in grouped.values()],
                        payloads=list(grouped.values()))
            if dynamic.full():
                break
        taken = dynamic.take()
        for eps in taken.payloads:
            kept += eps
        stats["rollout/dropped_groups"] = float(taken.num_dropped_all_zero + taken.num_dropped_all_one)
        return kept, {**stats, **rollout_metrics(kept, "rollout")}

    def evaluate_episodes(self, job: Job, params, step: int) -> list[Episode]:
        """Greedy, group 1, held-out tasks, the standard environment (no feedback schedule)."""
        c = job.cfg.rollout
        rcfg = RolloutConfig(max_turns=job.cfg.eval.max_turns, max_new_tokens=c.max_new_tokens,
                             enable_thinking=c.enable_thinking)
        episodes = []
        n = job.eval_sampler.batch_size
        for start in range(0, len(self.eval_tasks), n):
            chunk = self.eval_tasks[start:start + n]
            episodes += run_episodes(params, job.eval_sampler, self.envs, job.tokenizer, chunk,
                                     list(range(len(chunk))), rcfg, seed=job.cfg.seed + 1000, train_step=step,
                                     schedule=None)
        return episodes

    def evaluate(self, job: Job, params, step: int) -> dict[str, float]:
        return rollout_metrics(self.evaluate_episodes(job, params, step), "eval")

    def get_state(self) -> dict:
        return {"data": self.stream.get_state()}

    def set_state(self, state: dict) -> None:
        self.stream.set_state(state["data"])

    def close(self) -> None:
        self.envs.close()


def train_on(job: Job, state, episodes: list[Episode]):
    """Advantages over groups, then ppo_epochs x num_minibatches optimizer steps."""
    ok = [e for e in episodes if e.failure is None and len(e.conversation)]
    rewards = np.asarray([e.reward for e in ok], np.float64)
    group_ids = np.asarray([e.group for e in ok])
    adv = advantages(rewards, group_ids, **job.algo.advantage_kwargs())
    r = job.cfg.rl
    metrics = {}
    order = np.arange(len(ok))
    for _ in range(r.ppo_epochs):
        for mb in np.array_split(order, r.num_minibatches):
            batch = build_batch([ok[i].conversation for i in mb], adv[mb], row_multiple=job.row_multiple)
            if job.mesh is not None:
                batch = shard_batch(batch, job.mesh)
            state, m = job.train_step(state, batch, *(() if job.ref_params is None else (job.ref_params,)))
            metrics = {k: float(v) for k, v in jax.device_get(m).items()}
    return state, {f"train/{k}": v for k, v in metrics.items()}


# ----------------------------------------------------------------------------- the job


def _job(cfg) -> tuple[Job, Any]:
    maybe_initialize_distributed()
    mesh = make_mesh(MeshConfig(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor))
    model_config, params = build_model(cfg, mesh)
    tokenizer = load_tokenizer(_tokenizer_path(cfg.model))
    r, c = cfg.rl, cfg.rollout
    algo = preset(r.algorithm, kl_coef=r.kl_coef, entropy_coef=r.entropy_coef)
    opt = OptimizerConfig(lr=r.lr, weight_decay=r.weight_decay, grad_clip=r.grad_clip,
                          warmup_steps=r.warmup_steps).make()
    data_parallel = mesh.shape["data"] * mesh.shape["fsdp"]
    with_reference = bool(algo.kl_coef)
    step_fn = make_train_step(model_config, algo, opt, num_micro_batches=r.micro_batches, mesh=mesh,
                              agg_constant=float(c.max_new_tokens * c.max_turns), with_reference=with_reference)
    shardings = state_shardings(model_config, opt, mesh)
    # The reference is a copy (the state's parameters are donated to each step).
    ref_params = jax.tree.map(jnp.copy, params) if with_reference else None
    state = jax.device_put(init_train_state(params, opt), shardings)
    sampling = SamplingConfig(temperature=c.temperature, top_p=c.top_p)
    rows = c.tasks_per_step * c.group_size
    sampler = Sampler(model_config, batch_size=rows, max_len=c.max_len, sampling=sampling,
                      cache_dtype=cfg.model.cache_dtype)
    eval_sampler = Sampler(model_config, batch_size=min(rows, cfg.eval.tasks), max_len=c.max_len,
                           sampling=GREEDY, cache_dtype=cfg.model.cache_dtype)
    job = Job(cfg, mesh, model_config, tokenizer, sampler, eval_sampler, step_fn, algo,
              row_multiple=r.micro_batches * data_parallel, ref_params=ref_params)
    return job, state


def train(cfg, workload: Callable[[Job, Any], Any] = EnvWorkload) -> dict[str, Any]:
    """Runs (or resumes) the job described by `cfg`; returns the final metrics and history.

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
        start = extra["step"]
        work.set_state(extra["workload"])
        history = extra["history"]
        log.info("resumed from step %d", start)
    logger = MetricLogger(out, total_steps=cfg.steps, start=start)
    peak = max((h.get("eval/success", -1.0) for h in history), default=-1.0)
    try:
        for step in range(start + 1, cfg.steps + 1):
            t0 = time.perf_counter()
            episodes, stats = work.collect(job, state.params, step)
            t1 = time.perf_counter()
            state, train_metrics = train_on(job, state, episodes)
            t2 = time.perf_counter()
            metrics = {"step": step, **stats, **train_metrics,
                       "time/rollout_s": t1 - t0, "time/train_s": t2 - t1,
                       "time/tokens_per_s": sum(len(e.conversation) for e in episodes) / max(t2 - t0, 1e-9)}
            if cfg.eval.every and step % cfg.eval.every == 0:
                metrics.update(work.evaluate(job, state.params, step))
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
