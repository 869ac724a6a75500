"""What a run says as it starts: quiet logging by default, the checks of what it will need, and
a summary of what it runs.

`configure_logging` keeps third-party INFO logs (Orbax writes about 50 lines a checkpoint
through absl) out of the console unless `logging.verbose`; `preflight` refuses, in one line
and before any model is built, what would fail later (an unwritable out_dir, more devices than
there are, a missing or broken tokenizer, an unreadable task file); `summary` is the start-up
block: model and parameter count, dtypes, devices and mesh, envs and their task counts (and
tau2's user simulator), out_dir.
"""

from __future__ import annotations

import collections
import logging
import os
import tempfile

import jax

from jaxscaffold.config import ConfigError, RunConfig
from jaxscaffold.train import config_checks, user_model
from jaxscaffold.train.tasks import catalogue, env_names, load_tasks, parse_task_spec

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


def preflight(cfg: RunConfig) -> None:
    """What the run needs that its config cannot show, checked before the model is built:
    the names other modules define, out_dir writable, `mesh.devices` available, the tokenizer loadable, the JSONL task files
    (and the rewards they name) readable. Raises ConfigError or TaskSourceError (one line)."""
    config_checks.check(cfg)  # the names other modules define (the launchers checked them already)
    check_out_dir(cfg.out_dir)
    from jaxscaffold.models.sharding import maybe_initialize_distributed
    maybe_initialize_distributed()  # before the first device query, as build_job does
    if cfg.mesh.devices > jax.device_count():
        raise ConfigError(f"config.mesh.devices={cfg.mesh.devices}: there are {jax.device_count()} devices "
                          f"({jax.devices()[0].platform}); 0 uses all of them")
    _check_tokenizer(cfg)
    _check_jsonl_tasks(cfg)


def check_out_dir(out_dir: str) -> None:
    """ConfigError unless `out_dir` exists (made here) and a file can be written in it."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".write_check"):
            pass
    except OSError as e:
        raise ConfigError(f"config.out_dir={out_dir!r} is not writable ({e.strerror or e})") from None


def _check_tokenizer(cfg: RunConfig) -> None:
    from jaxscaffold.models import hub
    from jaxscaffold.models.tokenizer import load_tokenizer
    from jaxscaffold.train.job import tokenizer_path

    try:
        path = None if cfg.model.vocabulary else tokenizer_path(cfg.model)
    except hub.ModelNotFoundError as e:  # neither a directory nor a cached hub id
        if not cfg.model.tokenizer:
            raise  # model.hf_path's own one line
        raise ConfigError(f"config.model.tokenizer: cannot load a tokenizer from {cfg.model.tokenizer} ({e})") from None
    if path is None:
        return
    try:
        load_tokenizer(path)
    except Exception as e:  # noqa: BLE001  whatever the tokenizer library raises on a broken file
        text = str(e).strip().splitlines()
        raise ConfigError(f"config.model.tokenizer: cannot load a tokenizer from {path} ({type(e).__name__}: "
                          f"{text[0][:200] if text else ''})") from None


def _check_jsonl_tasks(cfg: RunConfig) -> None:
    """The JSONL task files of envs.train / envs.eval (a few reads): the config's reward first,
    whose module may register the names the lines use."""
    from jaxscaffold.envs import jsonl

    reward = cfg.envs.kwargs().get("jsonl", {}).get("reward")
    if reward is not None:
        try:
            jsonl.config_reward(reward)
        except ValueError as e:
            raise ConfigError(f"config.envs.env_kwargs: {e}") from None
    for spec, split in ((cfg.envs.train, cfg.envs.train_split), (cfg.envs.eval, cfg.envs.eval_split)):
        for entry in parse_task_spec(spec):
            if entry.env == "jsonl":
                catalogue("jsonl", entry.split or split)  # TaskSourceError: one line naming the file and line


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
