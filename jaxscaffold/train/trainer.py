"""The training loop: the one place that runs a job step by step.

  workload.collect (rollouts, rewards, metrics) -> train_on (advantages, optimizer steps)
     (rollout.max_staleness = k > 0: the next steps' rollouts collected meanwhile in a
     background thread, `collector.AheadCollector`)
  -> every eval.every steps (and at step 0): workload.evaluate -> logs, results.json
  -> every checkpoint.every steps: a checkpoint (every checkpoint.params_only_every: the
     parameters alone, in out_dir/params)
  -> at the end, with export.at_end: the HF export of the final parameters (and a workload's
     hand-off export: RWML's stage 1 for stage 2)

`train(cfg)` runs (or resumes) a whole job from a config (see `configs/`): the workload of
`cfg.job` (`workloads.base.WORKLOADS`: rl, rwml, wm_sft, sft). A run already at its end
returns at once (its config still checked), without building the model.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from typing import Any

import jax

from jaxscaffold import config as config_lib
from jaxscaffold.train import memory_check, resume, startup
from jaxscaffold.train.checkpoint import PARAMS_DIR, Checkpointer, CheckpointSaveError
from jaxscaffold.train.collector import AheadCollector, staleness_filter
from jaxscaffold.train.export import export_checkpoint
from jaxscaffold.train.failures import RunFailed, StepGuard
from jaxscaffold.train.job import build_job, optimizer_config
from jaxscaffold.train.logger import MetricLogger
from jaxscaffold.train.multihost import allgather_json, summed_over_processes
from jaxscaffold.train.results import running_peaks, write_results
from jaxscaffold.train.update import train_on
from jaxscaffold.train.workloads.base import WorkloadFactory, workload_for

log = logging.getLogger(__name__)

RESUME_KEYS = ("step", "workload", "history")  # what a checkpoint's JSON must hold to resume from it


def train(cfg, workload: WorkloadFactory | None = None) -> dict[str, Any]:
    """Runs (or resumes) the job described by `cfg`; returns the final metrics and history.

    Multi-host: every process runs `train(cfg)` (JAX's multi-controller runtime starts from the
    environment, see `maybe_initialize_distributed`); each runs its share of the rollouts and
    feeds its rows of the global batch; process 0 writes the logs.

    `workload(job, initial_params)` builds what a step collects and how the model is evaluated
    (default: the one `cfg.job` names, `workloads.base.workload_for`), a `workloads.base.Workload`.

    A run whose newest checkpoint is intact and at its end (`resume.finished_checkpoint`)
    trains nothing: the config is checked as for a resume, one line says so, the end-of-run
    exports are written again, and the result's "state" is None (no model is built).
    """
    cfg = config_lib.typed(cfg)
    startup.configure_logging(cfg.logging.verbose)
    changes = resume.check_resume(cfg)  # before the model is built: a refused change costs nothing
    startup.preflight(cfg)  # likewise an unwritable out_dir, a broken tokenizer or task file
    finished = resume.finished_checkpoint(cfg, RESUME_KEYS)
    if finished is not None:  # nothing to train: no model is built, nothing compiles
        return _finished_run(cfg, finished)
    memory_check.check_fits(cfg)  # likewise a run that cannot fit its devices
    workload = workload or workload_for(cfg)
    job, state = build_job(cfg)
    work = workload(job, job.policy_params(state.params))
    update = work.train_on if hasattr(work, "train_on") else train_on  # SFT workloads: their own step
    hand_off = work.hand_off_dir() if hasattr(work, "hand_off_dir") else None
    out = cfg.out_dir
    os.makedirs(out, exist_ok=True)
    ckpt = Checkpointer(os.path.join(out, "checkpoints"), keep=cfg.checkpoint.keep, cleanup_partial=True)
    history: list[dict] = []
    start = 0
    if ckpt.latest_step() is not None:
        # A step whose JSON lacks these keys is damaged like an unreadable one: the previous one resumes.
        _, state, extra = ckpt.restore_latest(state, required=RESUME_KEYS)
        start = extra["step"]
        work.set_state(extra["workload"])
        history = extra["history"]
        log.info("resumed from step %d", start)
    params_ckpt = _params_checkpointer(cfg, start)
    if jax.process_index() == 0:
        resume.write_config(cfg)
        model_params = state.params if job.lora is None else job.base_params  # LoRA: the state is the adapters
        print(startup.summary(cfg, job.mesh, model_params, start=start, changes=changes,
                              trainable=None if job.lora is None else state.params), file=sys.stderr, flush=True)
    # One process writes the logs (every process holds the same, gathered, metrics).
    # A workload may derive the run's length from its data (RWML: epochs over the triples).
    steps = work.total_steps(cfg.steps) if hasattr(work, "total_steps") else cfg.steps
    logger = MetricLogger.for_run(cfg, start=start, total_steps=steps)
    lr_at = optimizer_config(cfg).learning_rate()
    policy = None  # the samplers' parameters of this state (LoRA: merged once per update)
    guard = StepGuard(cfg.rl.max_bad_steps, cfg.rl.max_empty_steps)
    collector = None  # rollout.max_staleness > 0: the background collector
    try:
        if start == 0 and cfg.eval.every and cfg.eval.at_start:  # the untrained model's scores
            policy = job.policy_params(state.params)
            history.append({"step": 0, **_evaluate(work, job, policy, 0, history)})
            logger.log(0, history[-1])
            _write_results(cfg, history, steps)
        if cfg.rollout.max_staleness:
            collector = _ahead_collector(job, work, state, start, steps)
        for step in range(start + 1, steps + 1):
            ckpt.check()  # an asynchronous save that failed stops the run before another step
            t0 = time.perf_counter()
            if collector is None:
                policy = job.policy_params(state.params) if policy is None else policy
                episodes, stats = work.collect(job, policy, step)
            else:
                episodes, stats = _collected(collector, step, cfg.rollout.max_staleness)
            t1 = time.perf_counter()
            policy = None  # LoRA's merged copy is not held through the update
            state, train_metrics = update(job, state, episodes)
            if collector is not None:
                collector.publish(job.policy_params(state.params), step)
            train_metrics.setdefault("train/lr", float(lr_at(max(int(state.step) - 1, 0))))  # the step's last update's
            t2 = time.perf_counter()
            tokens = sum(allgather_json(sum(len(e.conversation) for e in episodes)))
            metrics = {"step": step, **stats, **train_metrics,
                       "time/rollout_s": t1 - t0, "time/train_s": t2 - t1,
                       "time/tokens_per_s": tokens / max(t2 - t0, 1e-9)}
            evaluated = cfg.eval.every and step % cfg.eval.every == 0
            if evaluated:
                policy = job.policy_params(state.params)
                with collector.paused() if collector is not None else contextlib.nullcontext():
                    metrics.update(_evaluate(work, job, policy, step, history))
            history.append(metrics)
            logger.log(step, metrics)
            guard.after_collect(step, episodes, sum(len(e.training_rows()) for e in episodes if e.failure is None))
            guard.after_update(step, train_metrics)  # (before the save: a failed run keeps its last good one)
            if evaluated:
                _write_results(cfg, history, steps)
            if step % cfg.checkpoint.every == 0 or step == steps:
                workload_state = work.get_state() if collector is None else collector.workload_state(step)
                ckpt.save(step, state, {"step": step, "workload": workload_state, "history": history,
                                        "config": cfg.to_dict(), "total_steps": steps, "hand_off": hand_off})
            if params_ckpt is not None and step % cfg.checkpoint.params_only_every == 0:
                params_ckpt.save(step, {"params": state.params}, {"step": step, "config": cfg.to_dict()})
        ckpt.wait()
    except RunFailed as e:
        if isinstance(e, CheckpointSaveError):
            raise
        with contextlib.suppress(CheckpointSaveError):
            ckpt.wait()  # the saves begun before the failure complete: the last one is named
        last = ckpt.last_complete_step()
        raise RunFailed(f"{e}; last checkpoint: {'none' if last is None else f'step {last}'} in {ckpt.directory}") from None
    finally:
        if collector is not None:
            collector.close()
        ckpt.close()
        if params_ckpt is not None:
            params_ckpt.close()
        work.close()
        logger.close(history)
        _write_results(cfg, history, steps)
    result = {"history": history, "state": state}
    if cfg.export.at_end and jax.process_index() == 0:
        result["export"] = export_at_end(cfg, steps)
    if hand_off and jax.process_index() == 0:
        result["export"] = export_checkpoint(cfg.out_dir, hand_off)
        log.info("exported the final checkpoint to %s for the next stage", hand_off)
    return result


def _finished_run(cfg, extra: dict) -> dict[str, Any]:
    """A run whose newest checkpoint is at its end (`resume.finished_checkpoint`, its JSON
    `extra`): one line, and the exports a run writes at its end, as a resumed run would write
    them again; "state" is None (the parameters are not read)."""
    if jax.process_index() != 0:
        return {"history": extra["history"], "state": None}
    print(f"run      {os.path.abspath(cfg.out_dir)}: finished at step {extra['step']}, nothing to train "
          f"(to go on: a larger --config.steps)", file=sys.stderr, flush=True)
    result = {"history": extra["history"], "state": None}
    if cfg.export.at_end:
        result["export"] = export_at_end(cfg, extra["step"])
    if extra.get("hand_off"):
        result["export"] = export_checkpoint(cfg.out_dir, extra["hand_off"])
        log.info("exported the final checkpoint to %s for the next stage", extra["hand_off"])
    return result


def _ahead_collector(job, work, state, start: int, steps: int) -> AheadCollector:
    """rollout.max_staleness = k > 0: the collector of steps start + 1..steps, from the state's
    policy (version `start`: on resume, collection restarts from the checkpoint's step). On
    several processes the workload's collect must be safe off the main thread (its
    `collects_off_main_thread`: `collector` says what that takes)."""
    if jax.process_count() > 1 and not getattr(work, "collects_off_main_thread", False):
        raise ValueError(f"rollout.max_staleness={job.cfg.rollout.max_staleness} on {jax.process_count()} processes: "
                         f"the {type(work).__name__} workload's collect may issue device collectives, which its "
                         "background thread must not (use 0 on several hosts)")
    return AheadCollector(work, job, job.policy_params(state.params), version=start,
                          first_step=start + 1, last_step=steps, max_staleness=job.cfg.rollout.max_staleness)


def _collected(collector: AheadCollector, step: int, max_staleness: int) -> tuple[list, dict]:
    """Step `step`'s episodes from the collector, rows more than `max_staleness` versions
    behind this step's policy (version step - 1) dropped, with the staleness metrics (of every
    process's rows)."""
    episodes, stats, _, seconds = collector.next(step)
    episodes, staleness = staleness_filter(episodes, step - 1, max_staleness)
    return episodes, {**stats, **summed_over_processes(staleness), "time/collect_s": seconds}


def _params_checkpointer(cfg, start: int) -> Checkpointer | None:
    """out_dir/params (checkpoint.params_only_every), without the steps after `start` (the
    resumed run saves them again)."""
    if not cfg.checkpoint.params_only_every:
        return None
    ckpt = Checkpointer(os.path.join(cfg.out_dir, PARAMS_DIR), keep=cfg.checkpoint.params_only_keep or None,
                        cleanup_partial=True)
    dropped = ckpt.delete_after(start)
    if dropped:
        log.info("params-only checkpoints %s are after the resumed step %d: deleted (saved again)", dropped, start)
    return ckpt


def export_at_end(cfg, step: int) -> dict:
    """export.at_end: the final checkpoint as an HF directory (export.dir, default out_dir/hf),
    as `launch/export_hf.py` writes it (LoRA: merged)."""
    out = cfg.export.dir or os.path.join(cfg.out_dir, "hf")
    report = export_checkpoint(os.path.join(cfg.out_dir, "checkpoints"), out, step=step,
                               dtype=cfg.export.dtype or None, verify=cfg.export.verify)
    log.info("exported step %d to %s", step, out)
    return report


def _evaluate(work, job, params, step: int, history: list[dict]) -> dict[str, Any]:
    """The workload's eval metrics at `step`, the time they took and the headline metrics'
    running peaks over `history` (`results.running_peaks`)."""
    t = time.perf_counter()
    metrics = work.evaluate(job, params, step)
    metrics["time/eval_s"] = time.perf_counter() - t
    return {**metrics, **running_peaks(history, metrics)}


def _write_results(cfg, history: list[dict], steps: int) -> None:
    """`out_dir/results.json` (process 0): after each evaluation, so a killed run leaves one."""
    if jax.process_index() == 0:
        write_results(cfg.out_dir, history, total_steps=steps)
