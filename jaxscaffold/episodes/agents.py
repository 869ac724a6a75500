"""Agents: what decides the actions of a batch of episodes the driver steps together.

The protocol (`Agent`) is batched, as the model samples every live episode at once:
`start` gets the first observations, `act` returns each live episode's text, `observe` the
next observations (or says which episodes have no room for another turn), `finish` attaches
what the agent recorded (token rows) to the episodes. Observations come as `Seen`: the env's
observation and the text the agent is shown (after feedback).

- `ModelAgent`: the policy on the sampler (token in, token out: the sampled ids are kept as
  sampled, the env gets the decoded text);
- `GoldAgent`: each benchmark's gold path (`jaxscaffold.envs.gold.GoldPolicy`);
- `ExplorerAgent`: RWML's scripted explorer, the expert action with probability p, else a
  random admissible command (tau2, which has none: a probe call, `gold.tau2_probe_call`).
The scripted agents read the observation's privileged state (the gold path, admissible
commands); the model agent reads only what it is shown.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
from typing import Mapping, Protocol, Sequence

import jax
import numpy as np

from jaxscaffold import seeds
from jaxscaffold.envs.actions import action_text
from jaxscaffold.envs.base import Observation
from jaxscaffold.envs.gold import GoldPolicy, tau2_probe_call
from jaxscaffold.envs.prompts import system_prompt
from jaxscaffold.episodes import representations
from jaxscaffold.episodes.episode import Episode
from jaxscaffold.models.chat import Qwen3ChatRenderer
from jaxscaffold.models.tokenizer import Tokenizer
from jaxscaffold.rollout.conversation import MultiTurn
from jaxscaffold.rollout.engine import Sampler

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Seen:
    """An observation as the agent gets it: the env's, and the text it is shown."""

    observation: Observation
    text: str


class Agent(Protocol):
    def start(self, episodes: Sequence[Episode], first: Mapping[int, Seen]) -> dict[int, str]:
        """The first observations; returns {episode: failure reason} for those it cannot run."""

    def act(self, live: Sequence[int], turn: int) -> dict[int, str]:
        """Each live episode's action text at `turn` (0-based)."""

    def observe(self, episodes: Sequence[Episode], seen: Mapping[int, Seen]) -> set[int]:
        """The next observations of the episodes that go on; returns those with no room left."""

    def finish(self, episodes: Sequence[Episode]) -> None:
        """Attach what the agent recorded to the episodes (after the last turn)."""


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """The model's rollout options (`max_turns` is the caller's to pass to the driver)."""

    max_turns: int = 15
    max_new_tokens: int = 256
    enable_thinking: bool = False
    representation: str = "trajectory"  # see `representations`
    history_window: int = 2  # step-wise: the (observation, action) pairs kept in the prompt


class ModelAgent:
    """The policy in the sampler's slots (episode i in slot i). `episode_ids[i]` (default i)
    keys episode i's sampling seeds, with `seed` and `train_step` (see `seeds.turn_seed`)."""

    def __init__(self, params, sampler: Sampler, tokenizer: Tokenizer, cfg: RolloutConfig, *, seed: int,
                 train_step: int, episode_ids: Sequence[int] | None = None):
        self.sampler, self.tokenizer, self.cfg = sampler, tokenizer, cfg
        self.chat = Qwen3ChatRenderer(tokenizer)
        self.representation = representations.make(
            cfg.representation, self.chat, enable_thinking=cfg.enable_thinking,
            history_window=cfg.history_window, im_end=tokenizer.token_id("<|im_end|>"))
        self.params = sampler.prepare(params)  # once: the layout the sampler decodes with
        self.seed, self.train_step, self.episode_ids = seed, train_step, episode_ids
        self.mt = MultiTurn(sampler)
        self.systems: dict[int, str] = {}
        self.gens: dict = {}

    def start(self, episodes, first):
        if len(episodes) > self.sampler.batch_size:
            raise ValueError(f"{len(episodes)} episodes do not fit the sampler's {self.sampler.batch_size} slots")
        failures, prompts = {}, {}
        for i, seen in first.items():
            ep = episodes[i]
            # Envs with per-task instructions (BFCL's function docs, tau2's policy and tools)
            # hand their system prompt over on the reset observation; the others use the template.
            system = self.systems[i] = seen.observation.system_prompt or system_prompt(ep.task.env)
            messages = [{"role": "system", "content": system}, {"role": "user", "content": seen.text}]
            ids = self.chat.render(messages, add_generation_prompt=True, enable_thinking=self.cfg.enable_thinking)
            if len(ids) + self.cfg.max_new_tokens > self.sampler.max_len - 1:
                # Reported like an env failure (excluded from the batch, counted), never a silent 0.
                log.warning("episode %d (%s): a first prompt of %d tokens leaves no room for %d new tokens in "
                            "max_len %d", i, ep.task.task_id, len(ids), self.cfg.max_new_tokens,
                            self.sampler.max_len)
                failures[i] = f"context: first prompt of {len(ids)} tokens"
                continue
            prompts[i] = ids
        if prompts:
            self.mt.extend(self.params, prompts)
            jax.block_until_ready(self.mt.state)  # the prefill's time is its own, not the next decode's
        return failures

    def act(self, live, turn):
        keys = self.episode_ids
        row_seeds = [seeds.turn_seed(self.seed, self.train_step, i if keys is None else keys[i], turn) for i in live]
        self.gens = self.mt.generate(self.params, live, max_new_tokens=self.cfg.max_new_tokens, seeds=row_seeds)
        eos = self.tokenizer.eos_ids
        return {i: self.tokenizer.decode([t for t in self.gens[i].tokens if t not in eos]) for i in live}

    def observe(self, episodes, seen):
        full, prompts = set(), {}
        for i, s in seen.items():
            ids, room = self.representation.next_prompt(self.mt, i, episodes[i], self.systems[i], s.text,
                                                        stopped=self.gens[i].finish_reason == "stop")
            if len(ids) + self.cfg.max_new_tokens > room:
                full.add(i)  # no room for another turn
                continue
            prompts[i] = ids
        # This turn's rows are complete (step-wise): free their slots for the new prompts.
        for i, conv in self.representation.close_turns(self.mt, list(prompts)).items():
            episodes[i].rows.append(conv)
        if prompts:
            self.mt.extend(self.params, prompts)
            jax.block_until_ready(self.mt.state)
        return full

    def finish(self, episodes):
        for i, ep in enumerate(episodes):
            if i in self.mt.conversations:
                ep.rows += self.representation.final_rows(self.mt.conversations[i])
                ep.conversation = self.mt.conversations[i]


class ScriptedAgent(abc.ABC):
    """Base of the per-episode scripted agents: `begin(i, episode, first)` at the start,
    `action(i, observation)` each step (the latest observation); no token rows."""

    def __init__(self):
        self.last: dict[int, Observation] = {}

    def start(self, episodes, first):
        for i, s in first.items():
            self.last[i] = s.observation
            self.begin(i, episodes[i], s.observation)
        return {}

    def act(self, live, turn):
        return {i: self.action(i, self.last[i]) for i in live}

    def observe(self, episodes, seen):
        self.last.update({i: s.observation for i, s in seen.items()})
        return set()

    def finish(self, episodes):
        pass

    def begin(self, i: int, episode: Episode, first: Observation) -> None:
        pass

    @abc.abstractmethod
    def action(self, i: int, obs: Observation) -> str:
        """The action text episode `i` takes after observation `obs`."""


class GoldAgent(ScriptedAgent):
    """Each benchmark's gold / expert path, in the action text an agent writes."""

    def __init__(self):
        super().__init__()
        self.policies: dict[int, GoldPolicy] = {}

    def begin(self, i, episode, first):
        self.policies[i] = GoldPolicy(episode.task.env, first)

    def action(self, i, obs):
        return self.policies[i].act(obs)


class ExplorerAgent(ScriptedAgent):
    """Each step the next expert action (`next_walkthrough_action`) with probability
    `gold_prob`, else a random admissible command (`admissible_commands` / `valid_actions`):
    real, varied transitions for runs whose policy cannot act yet. tau2 has neither: there the
    expert action is the gold path's next step (`GoldPolicy`) and the random one a probe call
    (`gold.tau2_probe_call`: another of the agent's tools on the task's own argument values).
    Draws come from one generator seeded with `seed`, episode after episode in index order."""

    def __init__(self, *, gold_prob: float, seed: int):
        super().__init__()
        self.gold_prob = gold_prob
        self.rng = np.random.default_rng(seed)
        self.envs: dict[int, str] = {}
        self.tau2: dict[int, tuple[GoldPolicy, Observation]] = {}

    def begin(self, i, episode, first):
        self.envs[i] = episode.task.env
        if episode.task.env == "tau2":  # no admissible commands: gold calls, or a probe call off the path
            self.tau2[i] = (GoldPolicy("tau2", first), first)

    def action(self, i, obs):
        p, rng = obs.privileged, self.rng
        if i in self.tau2:
            policy, first = self.tau2[i]
            probe = tau2_probe_call(first, lambda n: int(rng.integers(n))) if rng.random() >= self.gold_prob else None
            return probe or policy.act(obs)
        choices = list(p.get("admissible_commands") or p.get("valid_actions") or [])
        nxt = p.get("next_walkthrough_action")
        if not choices and not nxt:
            raise ValueError(f"{self.envs[i]}: the explorer needs admissible commands in the observation")
        action = nxt if nxt and (rng.random() < self.gold_prob or not choices) else choices[rng.integers(len(choices))]
        return action_text(action)
