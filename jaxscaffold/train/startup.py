"""What a run says as it starts: quiet logging by default and a summary of what it runs.

`configure_logging` keeps third-party INFO logs (Orbax writes about 50 lines a checkpoint
through absl) out of the console unless `logging.verbose`; `summary` is the start-up block:
model and parameter count, dtypes, devices and mesh, envs and their task counts (and tau2's user
simulator), out_dir.
"""

from __future__ import annotations

import collections
import logging
import os

import jax

from jaxscaffold.config import RunConfig
from jaxscaffold.train import user_model
from jaxscaffold.train.tasks import env_names, load_tasks

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(verbose: bool) -> None:
    """jaxscaffold's INFO lines and everyone's warnings; `verbose` adds the other libraries'
    INFO. Adds a stderr handler only when the process has none (a notebook or pytest keeps its
    own), so calling it again (the launcher, then `train`) changes nothing."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(format=FORMAT)
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    logging.getLogger("jaxscaffold").setLevel(logging.INFO)
    # absl's logger may carry its own level (absl flags): set it either way.
    logging.getLogger("absl").setLevel(logging.NOTSET if verbose else logging.WARNING)


def parameter_count(params) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(params))


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def task_counts(spec: str, split: str, limit: int | None = None) -> str:
    """"letters 1000 (train), sciworld 2 (test)": the tasks `spec` loads, per env and split."""
    counts = collections.Counter((t.env, t.split) for t in load_tasks(spec, split, limit))
    return ", ".join(f"{env} {n} ({s})" for (env, s), n in counts.items())


def summary(cfg: RunConfig, mesh, params, *, start: int, changes: dict | None = None, trainable=None) -> str:
    """The start-up block of a run (a few lines, no trailing newline); `trainable`: the trained
    parameters when they are not the model's (LoRA's adapters)."""
    m, ro = cfg.model, cfg.rollout
    devices = list(mesh.devices.flat)
    first = devices[0]
    n = parameter_count(params)
    model = f"{m.hf_path} (HF checkpoint)" if m.hf_path else f"preset {m.preset}"
    state = f"resumed from step {start}" if start else "fresh"
    if changes:
        state += " with " + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items())
    mesh_shape = " ".join(f"{k}={v}" for k, v in mesh.shape.items())
    evals = (f"{task_counts(cfg.envs.eval, cfg.envs.eval_split, cfg.eval.tasks)} every {cfg.eval.every} steps"
             if cfg.eval.every else "off (eval.every = 0)")
    run_envs = set(env_names(cfg.envs.train) + env_names(cfg.envs.eval))
    lines = [
        f"run      {os.path.abspath(cfg.out_dir)} ({state}; {cfg.steps} steps, job {cfg.job})",
        f"model    {model}: {n:,} parameters ({_count(n)}), params {m.param_dtype}, compute {m.compute_dtype}"
        + ("" if trainable is None else f"; LoRA rank {cfg.lora.rank} trains {parameter_count(trainable):,} "
           f"({_count(parameter_count(trainable))}) over a frozen {cfg.lora.base_dtype} base"),
        f"devices  {len(devices)} x {first.device_kind} ({first.platform}) on {jax.process_count()} "
        f"process(es); mesh {mesh_shape}",
        f"train    {task_counts(cfg.envs.train, cfg.envs.train_split)}; {ro.tasks_per_step} tasks x "
        f"{ro.group_size} rollouts a step, {cfg.rl.algorithm}, lr {cfg.rl.lr:g}",
        f"eval     {evals}",
        *([f"tau2     user {user_model.describe(cfg.envs.tau2_user)}"] if "tau2" in run_envs else []),
        f"logs     {os.path.join(os.path.abspath(cfg.out_dir), 'tb')} (tensorboard --logdir), metrics.jsonl, "
        f"config.json" + (f", wandb {cfg.logging.wandb}" if cfg.logging.wandb != "off" else ""),
    ]
    return "\n".join(lines)
