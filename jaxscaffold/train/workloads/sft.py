"""Supervised fine-tuning (`job = "sft"`): token-level cross-entropy (`rl.train_step.make_sft_step`)
on demonstrations, run by the one trainer (logs, evaluation, checkpoints and resume as RL's).

The demonstrations are the gold trajectories of the training tasks (`envs.train`), played once
through the episode driver by each environment's gold policy (`envs.gold`) and rendered as the
policy's rollouts render a trajectory: system prompt, observations as user turns, the gold
actions as the trained assistant turns. A JSONL task file (`envs.train = "jsonl:PATH"`) is the
plain case: one turn, the prompt answered with the line's "answer". Only episodes the gold path
won are kept. Each step trains on `rollout.tasks_per_step` of them, drawn with replacement by a
generator seeded once for the run; evaluation is task RL's (greedy, held-out tasks).

A study may supply its own demonstrations instead (`Demonstrations`: e.g. rows written afresh
each step by a teacher policy) and run them through the same trainer:
`train(cfg, workload=lambda job, params: SFTWorkload(job, params, demonstrations=source))`.
"""

from __future__ import annotations

import logging
from typing import Protocol, Sequence

import jax
import numpy as np

from jaxscaffold import seeds
from jaxscaffold.envs.base import Observation, Task
from jaxscaffold.envs.prompts import system_prompt
from jaxscaffold.episodes.agents import GoldAgent
from jaxscaffold.episodes.driver import run_episodes
from jaxscaffold.episodes.episode import Episode
from jaxscaffold.models.chat import Qwen3ChatRenderer
from jaxscaffold.models.sharding import shard_batch
from jaxscaffold.rl.train_step import make_sft_step
from jaxscaffold.rollout.conversation import Conversation
from jaxscaffold.train.batching import build_batch
from jaxscaffold.train.job import Job
from jaxscaffold.train.tasks import load_tasks
from jaxscaffold.train.workloads.base import register_workload
from jaxscaffold.train.workloads.env_rl import EnvWorkload

log = logging.getLogger(__name__)


def single_process(what: str) -> None:
    """SFT batches are built on one process (no process shares a step's rows yet)."""
    if jax.process_count() > 1:
        raise ValueError(f"{what} runs on one process only (have {jax.process_count()})")


def sft_update(step_fn, job: Job, state, conversations: Sequence[Conversation], prefix: str = "train"):
    """One SFT optimizer step of `step_fn` (`make_sft_step`) on `conversations` (their assistant
    tokens are the targets); returns the new state and the step's metrics as `prefix/name`."""
    batch = build_batch(list(conversations), np.zeros(len(conversations)), row_multiple=job.row_multiple)
    if job.mesh is not None:
        batch = shard_batch(batch, job.mesh)
    state, metrics = step_fn(state, batch)
    return state, {f"{prefix}/{k}": float(v) for k, v in jax.device_get(metrics).items()}


def add_answer(conv: Conversation, ids: Sequence[int]) -> None:
    """Appends `ids` as trained assistant tokens (a demonstration's, not sampled: log-prob 0)."""
    conv.ids += [int(i) for i in ids]
    conv.assistant_mask += [1] * len(ids)
    conv.logprobs += [0.0] * len(ids)


def demonstration(chat: Qwen3ChatRenderer, system: str, observations: Sequence[str], actions: Sequence[str],
                  enable_thinking: bool = False) -> Conversation:
    """A trajectory as the trajectory representation renders a rollout: the first prompt
    (system + first observation), then per action its assistant turn (trained) and the next
    observation as a user turn."""
    conv = Conversation()
    conv.add_context(chat.render([{"role": "system", "content": system}, {"role": "user", "content": observations[0]}],
                                 add_generation_prompt=True, enable_thinking=enable_thinking))
    for k, action in enumerate(actions):
        add_answer(conv, chat.assistant_completion({"role": "assistant", "content": action, "reasoning_content": ""},
                                                   enable_thinking=enable_thinking))
        if k + 1 < len(actions):
            conv.add_context(chat.continue_with_user(observations[k + 1], enable_thinking=enable_thinking))
    return conv


class _RecordingGold(GoldAgent):
    """The gold agent, keeping each episode's system prompt (an env's own, else the template's)."""

    def __init__(self):
        super().__init__()
        self.systems: dict[int, str] = {}

    def begin(self, i: int, episode: Episode, first: Observation) -> None:
        super().begin(i, episode, first)
        self.systems[i] = first.system_prompt or system_prompt(episode.task.env)


def gold_demonstrations(job: Job, envs, tasks: Sequence[Task]) -> tuple[list[tuple[Task, Conversation]], dict]:
    """The won gold trajectories of `tasks` that fit `rollout.max_len`, rendered with their
    task, and their counts."""
    c = job.cfg.rollout
    agent = _RecordingGold()
    episodes = run_episodes(agent, envs, list(tasks), max_turns=c.max_turns, lockstep=c.lockstep)
    chat = Qwen3ChatRenderer(job.tokenizer)
    won = [(i, e) for i, e in enumerate(episodes) if e.failure is None and e.won and e.actions]
    demos = [(e.task, demonstration(chat, agent.systems[i], e.observations, e.actions, c.enable_thinking))
             for i, e in won]
    fitting = [(task, conv) for task, conv in demos if len(conv) <= c.max_len]
    stats = {"sft/tasks": float(len(episodes)), "sft/gold_won": float(len(won)),
             "sft/too_long": float(len(demos) - len(fitting)), "sft/demonstrations": float(len(fitting))}
    if not fitting:
        raise ValueError(f"SFT: none of the {len(episodes)} training tasks gave a won gold trajectory within "
                         f"rollout.max_turns={c.max_turns} and rollout.max_len={c.max_len}")
    log.info("SFT demonstrations: %s", stats)
    return fitting, stats


class Demonstrations(Protocol):
    """A study's own source of SFT rows (`SFTWorkload(demonstrations=...)`)."""

    def batch(self, step: int) -> list[tuple[Task, Conversation]]:
        """Step `step`'s rows (their assistant tokens are the targets), each with its task."""

    def get_state(self) -> dict:
        """What resuming needs (JSON)."""

    def set_state(self, state: dict) -> None:
        """Restores `get_state`'s output."""


@register_workload("sft")
class SFTWorkload(EnvWorkload):
    """Supervised fine-tuning on the training tasks' gold demonstrations (see the module), or on
    `demonstrations` a study supplies; evaluation, environments and task sets as task RL's
    (`EnvWorkload`)."""

    def __init__(self, job: Job, params=None, demonstrations: Demonstrations | None = None):
        super().__init__(job, params)
        single_process("job='sft'")
        cfg = job.cfg
        self.source = demonstrations
        if demonstrations is None:
            self.demonstrations, self.data_stats = gold_demonstrations(
                job, self.envs, load_tasks(cfg.envs.train, cfg.envs.train_split))
        self.rng = np.random.default_rng(seeds.derive(cfg.seed, "sft"))
        self.sft_step = make_sft_step(job.model_config, job.spec.optimizer, num_micro_batches=cfg.rl.micro_batches,
                                      mesh=job.mesh)

    def collect(self, job: Job, params, step: int) -> tuple[list[Episode], dict]:
        """`tasks_per_step` demonstrations (as one-row episodes); the data's counts at step 1. A
        supplied source: its rows of the step."""
        if self.source is not None:
            return [Episode(task, g, conv, won=True, done=True)
                    for g, (task, conv) in enumerate(self.source.batch(step))], {}
        picked = self.rng.integers(len(self.demonstrations), size=job.cfg.rollout.tasks_per_step)
        episodes = [Episode(self.demonstrations[i][0], g, self.demonstrations[i][1], won=True, done=True)
                    for g, i in enumerate(picked)]
        return episodes, dict(self.data_stats) if step == 1 else {}

    def train_on(self, job: Job, state, episodes: list[Episode]):
        return sft_update(self.sft_step, job, state, [e.conversation for e in episodes])

    def get_state(self) -> dict:
        state = {"sft_rng": self.rng.bit_generator.state}
        return state if self.source is None else {**state, "source": self.source.get_state()}

    def set_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state["sft_rng"]
        if self.source is not None:
            self.source.set_state(state["source"])
