"""Multi-turn rollouts: the sampler's slots driven by environments, token in, token out.

This is where the model meets the environments (the training loop wires them): each
episode's observations are rendered into chat turns once and appended to its conversation;
the model's sampled ids are kept exactly as sampled; the environment gets the decoded text.
Feedback (FEE) rewrites an observation before it is rendered, following the schedule and
one decision per group; evaluation runs the same code with no schedule.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Protocol, Sequence

import numpy as np

from jaxscaffold.envs.base import Env, EnvError, Observation, StepResult, Task
from jaxscaffold.envs.pool import EpisodeFailure
from jaxscaffold.envs.prompts import history_window_text, system_prompt
from jaxscaffold.feedback import randomization
from jaxscaffold.feedback.schedule import Schedule
from jaxscaffold.models.chat import Qwen3ChatRenderer
from jaxscaffold.models.tokenizer import Tokenizer
from jaxscaffold.rollout.conversation import Conversation, MultiTurn
from jaxscaffold.rollout.engine import Sampler

log = logging.getLogger(__name__)


class EnvBatch(Protocol):
    """Batched environments (in process, or the process pool)."""

    def reset(self, tasks: Sequence[Task]) -> list[Observation | EpisodeFailure]: ...

    def step(self, actions: dict[int, str]) -> dict[int, StepResult | EpisodeFailure]: ...


class LocalEnvs:
    """Environments in this process, one per episode (tests, tiny runs); the same contract as
    `jaxscaffold.envs.pool.EnvPool`, which runs them in worker processes."""

    def __init__(self, factories: dict[str, Callable[[], Env]]):
        self.factories = factories
        self.envs: list[Env] = []

    def reset(self, tasks):
        self.close()
        self.envs, out = [], []
        for task in tasks:
            try:
                env = self.factories[task.env]()
                self.envs.append(env)
                out.append(env.reset(task))
            except (EnvError, OSError, RuntimeError) as e:
                log.warning("env reset failed for %s: %s", task.task_id, e)
                self.envs.append(None)
                out.append(EpisodeFailure(f"reset: {type(e).__name__}: {e}", "error", len(out), task))
        return out

    def step(self, actions):
        out = {}
        for i, text in actions.items():
            try:
                out[i] = self.envs[i].step(text)
            except (EnvError, OSError, RuntimeError) as e:
                log.warning("env step failed for episode %d: %s", i, e)
                out[i] = EpisodeFailure(f"step: {type(e).__name__}: {e}", "error", i)
        return out

    def close(self):
        for env in self.envs:
            if env is not None:
                env.close()
        self.envs = []


@dataclasses.dataclass
class Episode:
    task: Task
    group: int
    conversation: Conversation
    reward: float = 0.0
    won: bool = False
    steps: int = 0
    done: bool = False
    truncated: bool = False  # out of turns or context before the env said done
    failure: str | None = None
    feedback: list[tuple[int, str]] = dataclasses.field(default_factory=list)  # (episode step, kind)
    actions: list[str] = dataclasses.field(default_factory=list)  # the action texts sent to the env
    # The env's own observation texts (before feedback): the reset one, then one per step.
    observations: list[str] = dataclasses.field(default_factory=list)
    # Step-wise representation: one conversation (rebuilt prompt + response) per model turn.
    rows: list[Conversation] = dataclasses.field(default_factory=list)

    def training_rows(self) -> list[Conversation]:
        """The token rows this episode trains on: its step rows, or its one trajectory."""
        return self.rows or ([self.conversation] if len(self.conversation) else [])


# (kind, observation, episode step, the agent's actions so far) -> the enriched text
Enricher = Callable[[str, Observation, int, Sequence[str]], str]


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    max_turns: int = 15
    max_new_tokens: int = 256
    enable_thinking: bool = False
    # "trajectory": one growing token sequence per episode (env tokens masked, KV cache reused);
    # "stepwise": the reference code's rows, a prompt rebuilt each step from the task, the last
    # `history_window` (observation, action) pairs and the current observation.
    representation: str = "trajectory"
    history_window: int = 2


def run_episodes(params, sampler: Sampler, envs: EnvBatch, tokenizer: Tokenizer, tasks: Sequence[Task],
                 groups: Sequence[int], cfg: RolloutConfig, *, seed: int, train_step: int,
                 schedule: Schedule | None = None, randomization_mode: str = "group",
                 enrichers: dict[str, Enricher] | None = None, num_groups: int | None = None,
                 episode_ids: Sequence[int] | None = None) -> list[Episode]:
    """Runs one episode per task to the end (all in the sampler's slots at once).

    `groups[i]` is the GRPO group of episode i: rollouts of a group share task and seed and,
    under `randomization_mode="group"`, the same feedback decisions. `episode_ids[i]`
    (default i) keys episode i's sampling seeds, so a run split over processes samples the
    same episodes as one process when each passes the global ids of its share.
    """
    if len(tasks) > sampler.batch_size:
        raise ValueError(f"{len(tasks)} episodes do not fit the sampler's {sampler.batch_size} slots")
    if cfg.representation not in ("trajectory", "stepwise"):
        raise ValueError(f"unknown representation {cfg.representation!r} (trajectory, stepwise)")
    stepwise = cfg.representation == "stepwise"
    params = sampler.prepare(params)  # once: the layout the sampler decodes with
    episode_keys = list(range(len(tasks))) if episode_ids is None else list(episode_ids)
    chat = Qwen3ChatRenderer(tokenizer)
    im_end = tokenizer.token_id("<|im_end|>")
    num_groups = num_groups or (max(groups) + 1 if groups else 0)
    rollout_index = {}
    episodes = []
    for i, (task, g) in enumerate(zip(tasks, groups)):
        rollout_index[i] = sum(1 for j in range(i) if groups[j] == g)
        episodes.append(Episode(task, g, Conversation()))

    def render_observation(i: int, obs: Observation) -> str:
        ep, text = episodes[i], obs.text
        if schedule is None:
            return text
        for kind in schedule.active_kinds(train_step, ep.steps):
            p = schedule.probability(kind, train_step)
            if enrichers and ep.task.env in enrichers and randomization.decide(
                    randomization_mode, p, run_seed=seed, train_step=train_step, group_id=ep.group,
                    num_groups=num_groups, rollout=rollout_index[i], kind=kind):
                enriched = enrichers[ep.task.env](kind, dataclasses.replace(obs, text=text), ep.steps, ep.actions)
                if enriched != text:  # counted only when the agent really sees something more
                    ep.feedback.append((ep.steps, kind))
                text = enriched
        return text

    mt = MultiTurn(sampler)
    systems: dict[int, str] = {}
    first = {}
    for i, obs in enumerate(envs.reset(tasks)):
        if isinstance(obs, EpisodeFailure):
            episodes[i].failure, episodes[i].done = obs.reason, True
            continue
        episodes[i].observations.append(obs.text)
        # An env with per-task instructions (BFCL's function docs, tau2's policy and tools)
        # hands its system prompt over on the reset observation; the others use the template.
        system = systems[i] = obs.privileged.get("system_prompt") or system_prompt(tasks[i].env)
        messages = [{"role": "system", "content": system},
                    {"role": "user", "content": render_observation(i, obs)}]
        ids = chat.render(messages, add_generation_prompt=True, enable_thinking=cfg.enable_thinking)
        if len(ids) + cfg.max_new_tokens > sampler.max_len - 1:
            # Reported like an env failure (excluded from the batch, counted), never a silent 0.
            log.warning("episode %d (%s): a first prompt of %d tokens leaves no room for %d new tokens in "
                        "max_len %d", i, tasks[i].task_id, len(ids), cfg.max_new_tokens, sampler.max_len)
            episodes[i].failure, episodes[i].done = f"context: first prompt of {len(ids)} tokens", True
            continue
        first[i] = ids
    if first:
        mt.extend(params, first)

    for turn in range(cfg.max_turns):
        live = [i for i, ep in enumerate(episodes) if not ep.done]
        if not live:
            break
        seeds = [_seed(seed, train_step, episode_keys[i], turn) for i in live]
        gens = mt.generate(params, live, max_new_tokens=cfg.max_new_tokens, seeds=seeds)
        actions = {i: tokenizer.decode([t for t in gens[i].tokens if t not in tokenizer.eos_ids]) for i in live}
        results = envs.step(actions)
        for i in live:
            episodes[i].actions.append(_action_of(actions[i]))
        extend = {}
        for i in live:
            ep, res = episodes[i], results[i]
            if isinstance(res, EpisodeFailure):
                ep.failure, ep.done = res.reason, True
                continue
            ep.steps += 1
            ep.observations.append(res.observation.text)
            ep.reward += float(res.reward)
            ep.won = ep.won or bool(res.info.get("won", False))
            if res.done:
                ep.done = True
                continue
            shown = render_observation(i, res.observation)
            if stepwise:
                window = list(zip(ep.observations[:-1], ep.actions))[-cfg.history_window:] if cfg.history_window else []
                user = history_window_text(ep.observations[0], window, shown, ep.steps)
                ids = chat.render([{"role": "system", "content": systems[i]}, {"role": "user", "content": user}],
                                  add_generation_prompt=True, enable_thinking=cfg.enable_thinking)
                room = sampler.max_len - 1
            else:
                ids = chat.continue_with_user(shown, enable_thinking=cfg.enable_thinking)
                if gens[i].finish_reason != "stop":
                    ids = [im_end] + ids  # close a turn cut off by max_new_tokens
                room = mt.room(i)
            if len(ids) + cfg.max_new_tokens > room:
                ep.done = ep.truncated = True  # no room for another turn
                continue
            extend[i] = ids
        if stepwise and extend:  # this step's rows are complete: free their slots for the new prompts
            for i, conv in mt.release(list(extend)).items():
                episodes[i].rows.append(conv)
        if extend:
            mt.extend(params, extend)
    for i, ep in enumerate(episodes):
        if not ep.done:
            ep.done = ep.truncated = True
        if i in mt.conversations:
            if stepwise:
                ep.rows.append(mt.conversations[i])
            ep.conversation = mt.conversations[i]
    return episodes


def _action_of(text: str) -> str:
    """The action an agent's text names (for feedback that tracks progress on a gold path)."""
    from jaxscaffold.envs.actions import parse_action
    parsed = parse_action(text)
    return parsed.action if parsed.action is not None else text.strip()


def _seed(run_seed: int, train_step: int, episode: int, turn: int) -> int:
    seq = np.random.SeedSequence([run_seed & 0xFFFFFFFF, train_step, episode, turn])
    return int(seq.generate_state(1)[0])


def complete(params, sampler: Sampler, tokenizer: Tokenizer, prompts: Sequence[Sequence[int]], *,
             max_new_tokens: int, seed: int, first_row: int = 0) -> list[tuple[Conversation, str]]:
    """One assistant turn for each prompt (ids from the chat renderer), `sampler.batch_size` at
    a time: (the conversation, token exact, and the turn's text without the stop token).
    Row i's sampling seed derives from (seed, first_row + i), so a row is reproducible on its own."""
    out: list[tuple[Conversation, str]] = []
    params = sampler.prepare(params)  # once: the layout the sampler decodes with
    for start in range(0, len(prompts), sampler.batch_size):
        chunk = prompts[start:start + sampler.batch_size]
        for p in chunk:
            if len(p) + 1 > sampler.max_len:
                raise ValueError(f"a prompt of {len(p)} tokens does not fit the sampler's {sampler.max_len} slots")
        mt = MultiTurn(sampler)
        mt.extend(params, dict(enumerate(chunk)))
        slots = list(range(len(chunk)))
        gens = mt.generate(params, slots, max_new_tokens=max_new_tokens,
                           seeds=[_seed(seed, 0, first_row + start + i, 0) for i in slots])
        for i in slots:
            text = tokenizer.decode([t for t in gens[i].tokens if t not in tokenizer.eos_ids])
            out.append((mt.conversations[i], text))
    return out
