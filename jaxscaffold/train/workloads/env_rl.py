"""Task RL on environments: each step's rollouts (a task stream, the feedback schedule, DAPO's
dynamic sampling) and the greedy evaluation on held-out tasks in the standard environment."""

from __future__ import annotations

import itertools
import logging
import os
from typing import Sequence

import jax
import numpy as np

from jaxscaffold import seeds
from jaxscaffold.envs.base import Task
from jaxscaffold.feedback import bandit as bandit_lib
from jaxscaffold.feedback import enrichers as enrichers_lib
from jaxscaffold.feedback import schedule as schedule_lib
from jaxscaffold.feedback.apply import Feedback
from jaxscaffold.episodes.agents import ModelAgent, RolloutConfig
from jaxscaffold.episodes.driver import run_episodes
from jaxscaffold.episodes.episode import Episode
from jaxscaffold.episodes.timing import Timings
from jaxscaffold.rl import dapo
from jaxscaffold.train.envs import make_envs
from jaxscaffold.train.evaluation import score_metrics
from jaxscaffold.train.job import Job
from jaxscaffold.train.logger import StepLog
from jaxscaffold.train.metrics import episode_summaries, informative_share, summary_metrics
from jaxscaffold.train.multihost import allgather_json, process_share, sampler_params
from jaxscaffold.train.waves import groups_per_wave, waves
from jaxscaffold.train.workloads.base import register_workload
from jaxscaffold.train.tasks import TaskStream, describe_tasks, env_names, load_eval_tasks, load_tasks


log = logging.getLogger(__name__)


def rollout_config(c, max_turns: int) -> RolloutConfig:
    """The rollout options of `config.rollout` (train and eval differ only in max_turns)."""
    return RolloutConfig(max_turns=max_turns, max_new_tokens=c.max_new_tokens, enable_thinking=c.enable_thinking,
                         representation=c.representation, history_window=c.history_window)


def _groups_of(episodes: list[Episode]) -> dict[int, list[Episode]]:
    """The episodes that ran (no infrastructure failure), by group."""
    groups: dict[int, list[Episode]] = {}
    for ep in episodes:
        if ep.failure is None:
            groups.setdefault(ep.group, []).append(ep)
    return groups


@register_workload("rl")
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
            arms = f.arms()
            self.schedules = {a: schedule_lib.make(a, p=f.probability, switch=f.switch_step) for a in arms}
            self.bandit = bandit_lib.BanditState.create(arms, discount=f.bandit_discount, prior=f.bandit_prior)
        else:
            self.schedule = schedule_lib.make(f.schedule, p=f.probability, switch=f.switch_step)
        self.stream = TaskStream(load_tasks(cfg.envs.train, cfg.envs.train_split), seed=seeds.derive(cfg.seed, "tasks"))
        # Balanced over each env's categories, the same on every process (`load_eval_tasks`).
        self.eval_tasks = load_eval_tasks(cfg.envs.eval, cfg.envs.eval_split, cfg.eval.tasks,
                                          seeds.derive(cfg.seed, "eval_tasks"))
        log.debug("evaluation set: %s", describe_tasks(self.eval_tasks))  # counts are in the start-up summary
        forms = {"ag": f.ag_form, "oe": f.oe_form}
        self.enrichers = {n: e for n in names if (e := enrichers_lib.enricher(n, forms)) is not None}
        self.feedback_log = StepLog(os.path.join(cfg.out_dir, "feedback.jsonl"), write=jax.process_index() == 0)

    def schedule_at(self, step: int) -> schedule_lib.Schedule:
        """The feedback schedule of a training step: the fixed one, or the bandit's arm."""
        if self.bandit is None:
            return self.schedule
        arm = bandit_lib.choose(self.bandit, run_seed=self.seed, train_step=step, group_id=0)
        return self.schedules[arm]

    partial_rollouts = True  # `collect` takes `refresh_params` (`train.collector`, rollout.partial)
    # On several processes `collect` gathers only through `allgather_json` and converts the
    # parameters only through `sampler_params`: it may run in the collector's thread.
    collects_off_main_thread = True

    def collect(self, job: Job, params, step: int, refresh_params=None) -> tuple[list[Episode], dict]:
        """Rollouts for one train step; DAPO's dynamic sampling keeps generating until enough
        groups have mixed binary success. After max_num_gen_batches without enough, it trains
        on the groups it has (`rollout/dynamic_sampling_exhausted` = 1; the reference's
        EnvAsScaffold does so), or with `rl.dynamic_sampling_exhausted = "raise"` raises
        `DynamicSamplingExhausted` (verl's DAPO recipe).

        On several processes each runs its share of the step's groups (`process_share`; the
        task stream is the same on every process) and returns its own episodes, whole groups,
        to train on; the metrics, the feedback log and the bandit see every process's.

        `refresh_params` (partial rollouts): the agents' source of newer weights (`ModelAgent`)."""
        schedule = self.schedule_at(step)
        kept, generated, kept_summaries, stats = self._fill_batch(job, sampler_params(params, job.sampler), step,
                                                                  schedule, refresh_params)
        stats.update(self._record(step, schedule, generated, kept_summaries))
        return kept, stats

    def _generation_batch(self, job: Job, params, step: int, schedule, batch_index: int, groups: list[int],
                          share: int, timings: Timings, refresh_params=None) -> list[Episode]:
        """One generation batch: the stream's next `tasks_per_step` tasks (taken on every
        process: streams stay equal), this process's `groups` of them run by the driver, each
        group's episodes numbered apart from other generation batches'."""
        cfg, c = job.cfg, job.cfg.rollout
        rcfg = rollout_config(c, c.max_turns)
        tasks = self.stream.take(c.tasks_per_step)
        run_seed = seeds.derive(cfg.seed, "rollout", batch_index)
        feedback = Feedback(schedule, self.enrichers, mode=cfg.feedback.mode, run_seed=run_seed,
                            train_step=step, num_groups=len(tasks))
        episodes = []
        # Asynchronous: the whole batch at once, episodes taking the sampler's slots as they
        # free; lock step: in waves of whole groups that fit the slots (rollout.max_rows_in_flight).
        for wave in waves(groups, groups_per_wave(c, share) if c.lockstep else max(1, len(groups))):
            flat = [tasks[g] for g in wave for _ in range(c.group_size)]
            wave_groups = [g for g in wave for _ in range(c.group_size)]
            episode_ids = [g * c.group_size + r for g in wave for r in range(c.group_size)]
            agent = ModelAgent(params, job.sampler, job.tokenizer, rcfg, seed=run_seed, train_step=step,
                               episode_ids=episode_ids, refresh_params=refresh_params)
            episodes += run_episodes(agent, self.envs, flat, wave_groups, max_turns=rcfg.max_turns, feedback=feedback,
                                     timings=timings, lockstep=c.lockstep, decode_chunk=c.decode_chunk,
                                     admit_wait_ms=c.admit_wait_ms)
        for e in episodes:  # groups of different generation batches stay apart
            e.group += batch_index * c.tasks_per_step
        return episodes

    def _fill_batch(self, job: Job, params, step: int, schedule,
                    refresh_params=None) -> tuple[list[Episode], list[dict], list[dict], dict]:
        """Generation batches until DAPO's batch is full (one without dynamic sampling): this
        process's episodes to train on, the summaries of every process's generated and kept
        episodes, and the generation metrics."""
        cfg, c = job.cfg, job.cfg.rollout
        share = process_share(c.tasks_per_step)
        dynamic = dapo.DynamicSampler(len(share), None) if job.algo.dynamic_sampling else None
        limit = job.algo.max_num_gen_batches if dynamic else 1
        generated: list[dict] = []  # every process's episodes of every generation batch
        batches, exhausted = 0, False
        timings = Timings()  # every generation batch's driver calls
        for batch_index in itertools.count() if limit is None or limit <= 0 else range(limit):
            mine = [] if dynamic is not None and dynamic.full() else list(share)
            episodes = self._generation_batch(job, params, step, schedule, batch_index, mine, len(share), timings,
                                              refresh_params)
            batches += 1
            if dynamic is not None and episodes:
                # Informative groups (`rl.advantages.informative`) on binary success (`won`), the
                # reference's filter metric: a shaped reward would keep groups differing in length only.
                grouped = _groups_of(episodes)
                dynamic.add([np.asarray([float(e.won) for e in eps]) for eps in grouped.values()],
                            payloads=list(grouped.values()))
            parts = allgather_json({"episodes": episode_summaries(episodes),
                                    "full": dynamic is None or dynamic.full()})
            generated += [s for part in parts for s in part["episodes"]]
            if all(part["full"] for part in parts):
                break
        else:  # every allowed generation batch ran and some process still lacks groups
            exhausted = True
            if cfg.rl.dynamic_sampling_exhausted == "raise":
                raise dapo.DynamicSamplingExhausted(
                    f"dynamic sampling did not collect {c.tasks_per_step} groups with mixed success in "
                    f"{batches} generation batches (rl.algorithm={job.algo.name}, max_num_gen_batches={limit}); "
                    f"{informative_share(generated):.0%} of the groups had unequal rewards")
        stats = {"rollout/generation_batches": float(batches),
                 "rollout/informative_groups": informative_share(generated), **timings.stats()}
        if dynamic is None:
            return episodes, generated, generated, stats
        stats["rollout/dynamic_sampling_exhausted"] = float(exhausted)
        taken = dynamic.take(partial=exhausted)
        kept = [e for eps in taken.payloads for e in eps]
        parts = allgather_json({"kept": episode_summaries(kept), "dropped": taken.num_dropped,
                                "overflow": taken.num_overflow})
        kept_summaries = [s for part in parts for s in part["kept"]]
        stats["rollout/dropped_groups"] = float(sum(part["dropped"] for part in parts))
        stats["rollout/overflow_groups"] = float(sum(part["overflow"] for part in parts))
        stats["rollout/trained_groups"] = float(len({e["group"] for e in kept_summaries}))
        return kept, generated, kept_summaries, stats

    def _record(self, step: int, schedule, generated: list[dict], kept_summaries: list[dict]) -> dict:
        """The kept episodes' rollout metrics, the bandit's update on every generated group and
        the step's enrichments appended to the feedback log."""
        stats = summary_metrics(kept_summaries, "rollout")
        if self.bandit is not None:
            stats.update(self._learn_schedule(schedule.name, generated))
        kept_groups = {e["group"] for e in kept_summaries}
        self.feedback_log.write(step, [
            {"step": step, "group": e["group"], "rollout": e["rollout"], "task": e["task"], "env": e["env"],
             "episode_step": s, "kind": k, "schedule": schedule.name, "kept": e["group"] in kept_groups}
            for e in generated for s, k in e["feedback"]])
        return stats

    def _learn_schedule(self, arm: str, generated: list[dict]) -> dict:
        """Updates the bandit with the step's learning signal (of every generated group, also
        those DAPO dropped: the signal is how many groups feedback made informative)."""
        if self.signal == "informative":  # on the rewards, what the advantages see
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

    def evaluate_episodes(self, job: Job, params, step: int, tasks: Sequence[Task] | None = None) -> list[Episode]:
        """Greedy, group 1, held-out tasks (`tasks`, default the config's `eval_tasks`), the
        standard environment (no feedback schedule). On several processes each runs (and
        returns) its share of the tasks."""
        c = job.cfg.rollout
        rcfg = rollout_config(c, job.cfg.eval.max_turns)
        params = sampler_params(params, job.eval_sampler)
        everyone = self.eval_tasks if tasks is None else list(tasks)
        tasks = [everyone[i] for i in process_share(len(everyone))]
        episodes = []
        # Asynchronous: every task at once, in the sampler's slots as they free; lock step: in
        # chunks of the slots. Greedy, so the rows' seeds (keyed by index) choose nothing.
        n = job.eval_sampler.batch_size if c.lockstep else max(1, len(tasks))
        for start in range(0, len(tasks), n):
            chunk = tasks[start:start + n]
            agent = ModelAgent(params, job.eval_sampler, job.tokenizer, rcfg, seed=seeds.derive(job.cfg.seed, "eval"),
                               train_step=step)
            episodes += run_episodes(agent, self.envs, chunk, max_turns=rcfg.max_turns, lockstep=c.lockstep,
                                     decode_chunk=c.decode_chunk, admit_wait_ms=c.admit_wait_ms)
        return episodes

    def evaluate(self, job: Job, params, step: int) -> dict[str, float]:
        """`summary_metrics` of every process's evaluation episodes (`eval/success` pools them
        all) and the paper's scores (`evaluation.score_metrics`: per env, per category, and
        `eval/score`)."""
        summaries = [s for part in allgather_json(episode_summaries(self.evaluate_episodes(job, params, step)))
                     for s in part]
        return {**summary_metrics(summaries, "eval"), **score_metrics(summaries, "eval")}

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
