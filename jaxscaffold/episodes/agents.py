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
import time
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
    """Episodes are the driver's indices (positions in its task list), never sampler slots."""

    capacity: int | None  # episodes the agent can hold at once (None: any number)

    def start(self, episodes: Sequence[Episode], first: Mapping[int, Seen]) -> dict[int, str]:
        """The first observations; returns {episode: failure reason} for those it cannot run."""

    def act(self, live: Sequence[int], turn: int) -> dict[int, str]:
        """Each live episode's action text at `turn` (0-based), decoded to the end (lock step)."""

    def decode(self, turns: Mapping[int, int], chunk: int) -> dict[int, str]:
        """Advances each episode's turn (`turns`: episode -> its turn, 0-based) by up to
        `chunk` tokens and returns the action texts of the turns that ended; the others
        continue at the next call (asynchronous driver)."""

    def observe(self, episodes: Sequence[Episode], seen: Mapping[int, Seen]) -> set[int]:
        """The next observations of the episodes that go on; returns those with no room left."""

    def release(self, episodes: Sequence[Episode], i: int) -> None:
        """Episode `i` has ended: attach what the agent recorded and free its place."""

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
    """The policy in the sampler's slots. Each episode holds a slot from `start` to `release`
    (episode i in slot i when that slot is free, as in lock step; else the lowest free one).
    `episode_ids[i]` (default i) keys episode i's sampling seeds, with `seed` and `train_step`
    (see `seeds.turn_seed`), so its tokens do not depend on its slot or batch.

    `refresh_params` (optional; partial rollouts, `rollout.partial`) is where newer weights
    enter between decode chunks: a callable returning (params, version), asked at construction
    (its params replace `params`) and before each chunk; the agent swaps to them when the version
    changes, and after each chunk records the version on the tokens it sampled
    (`Conversation.record_version`), so every token keeps the version that sampled it. At a swap
    the KV cache of the earlier tokens is kept (computed by the older weights); `reprefill=True`
    recomputes it under the new ones first (exact, one prefill of every held row's history).
    Without `refresh_params` no version is recorded here (the caller records one for all)."""

    def __init__(self, params, sampler: Sampler, tokenizer: Tokenizer, cfg: RolloutConfig, *, seed: int,
                 train_step: int, episode_ids: Sequence[int] | None = None, refresh_params=None,
                 reprefill: bool = False):
        self.sampler, self.tokenizer, self.cfg = sampler, tokenizer, cfg
        self.chat = Qwen3ChatRenderer(tokenizer)
        self.representation = representations.make(
            cfg.representation, self.chat, enable_thinking=cfg.enable_thinking,
            history_window=cfg.history_window, im_end=tokenizer.token_id("<|im_end|>"))
        self.refresh_params, self.version, self.reprefill = refresh_params, None, reprefill
        if refresh_params is not None:  # the newest version from the first prefill on
            params, self.version = refresh_params()
        self.params = sampler.prepare(params)  # once per version: the layout the sampler decodes with
        self.seed, self.train_step, self.episode_ids = seed, train_step, episode_ids
        self.swaps, self.swap_s = 0, 0.0  # versions swapped in mid-call (partial rollouts), their seconds
        self.capacity = sampler.batch_size
        self.mt = MultiTurn(sampler)
        self.slot_of: dict[int, int] = {}  # episode -> its sampler slot
        self.systems: dict[int, str] = {}
        self.gens: dict = {}  # episode -> its last turn's Generation

    def _row_seed(self, i: int, turn: int) -> int:
        return seeds.turn_seed(self.seed, self.train_step, i if self.episode_ids is None else self.episode_ids[i],
                               turn)

    def _take_slot(self, i: int) -> int:
        used = set(self.slot_of.values())
        if len(used) >= self.sampler.batch_size:
            raise ValueError(f"episode {i} does not fit: all {self.sampler.batch_size} sampler slots are taken")
        slot = i if i < self.sampler.batch_size and i not in used else min(set(range(self.sampler.batch_size)) - used)
        self.slot_of[i] = slot
        return slot

    def start(self, episodes, first):
        failures, prompts = {}, {}
        for i, seen in first.items():
            ep = episodes[i]
            # Envs with per-task instructions (BFCL's function docs, tau2's policy and tools)
            # hand their system prompt over on the reset observation; the others use the template.
            system = self.systems[i] = seen.observation.system_prompt or system_prompt(ep.task.env)
            messages = [{"role": "system", "content": system}, {"role": "user", "content": seen.text}]
            ids = self.chat.render(messages, add_generation_prompt=True, enable_thinking=self.cfg.enable_thinking)
            if len(ids) + self.cfg.max_new_tokens > self.sampler.max_len - 1:
                # Reported like an env failure (excluded from the batch, counted, and summarised
                # in one line a step by the trainer), never a silent 0.
                log.debug("episode %d (%s): first prompt of %d tokens", i, ep.task.task_id, len(ids))
                failures[i] = (f"context: a first prompt of {len(ids)} tokens leaves no room for "
                               f"{self.cfg.max_new_tokens} new tokens in max_len {self.sampler.max_len}")
                continue
            prompts[self._take_slot(i)] = ids
        if prompts:
            self.mt.extend(self.params, prompts)
            jax.block_until_ready(self.mt.state)  # the prefill's time is its own, not the next decode's
        return failures

    def act(self, live, turn):
        out = self.mt.generate(self.params, [self.slot_of[i] for i in live], max_new_tokens=self.cfg.max_new_tokens,
                               seeds=[self._row_seed(i, turn) for i in live])
        self.gens = {i: out[self.slot_of[i]] for i in live}
        eos = self.tokenizer.eos_ids
        return {i: self.tokenizer.decode([t for t in self.gens[i].tokens if t not in eos]) for i in live}

    def decode(self, turns, chunk):
        if self.refresh_params is not None:  # the swap point of partial rollouts
            params, version = self.refresh_params()
            if version != self.version:
                t0 = time.perf_counter()
                self.params, self.version = self.sampler.prepare(params), version
                if self.reprefill:
                    self.mt.reprefill(self.params, list(self.mt.conversations))
                jax.block_until_ready((self.params, self.mt.state))
                self.swaps, self.swap_s = self.swaps + 1, self.swap_s + time.perf_counter() - t0
        episode_of = {self.slot_of[i]: i for i in turns}
        ended = self.mt.decode(self.params, {self.slot_of[i]: (self.cfg.max_new_tokens, self._row_seed(i, t))
                                             for i, t in turns.items()}, chunk=chunk)
        if self.refresh_params is not None:  # this chunk's tokens are this version's
            for slot in episode_of:
                self.mt.conversations[slot].record_version(self.version)
        eos, out = self.tokenizer.eos_ids, {}
        for slot, gen in ended.items():
            i = episode_of[slot]
            self.gens[i] = gen
            out[i] = self.tokenizer.decode([t for t in gen.tokens if t not in eos])
        return out

    def observe(self, episodes, seen):
        full, prompts = set(), {}
        for i, s in seen.items():
            slot = self.slot_of[i]
            ids, room = self.representation.next_prompt(self.mt, slot, episodes[i], self.systems[i], s.text,
                                                        stopped=self.gens[i].finish_reason == "stop")
            if len(ids) + self.cfg.max_new_tokens > room:
                full.add(i)  # no room for another turn
                continue
            prompts[i] = ids
        # This turn's rows are complete (step-wise): free their slots for the new prompts.
        episode_of = {self.slot_of[i]: i for i in prompts}
        closed = self.representation.close_turns(self.mt, [self.slot_of[i] for i in prompts])
        for slot, conv in closed.items():
            episodes[episode_of[slot]].rows.append(conv)
        if prompts:
            self.mt.extend(self.params, {self.slot_of[i]: ids for i, ids in prompts.items()})
            jax.block_until_ready(self.mt.state)
        return full

    def release(self, episodes, i):
        slot = self.slot_of.pop(i, None)
        if slot is None:
            return
        if slot in self.mt.conversations:
            conv = self.mt.release([slot])[slot]
            episodes[i].rows += self.representation.final_rows(conv)
            episodes[i].conversation = conv
        self.gens.pop(i, None)

    def finish(self, episodes):
        for i, ep in enumerate(episodes):
            slot = self.slot_of.get(i)
            if slot in self.mt.conversations:
                ep.rows += self.representation.final_rows(self.mt.conversations[slot])
                ep.conversation = self.mt.conversations[slot]


class ScriptedAgent(abc.ABC):
    """Base of the per-episode scripted agents: `begin(i, episode, first)` at the start,
    `action(i, observation)` each step (the latest observation); no token rows."""

    capacity = None  # any number of episodes at once

    def __init__(self):
        self.last: dict[int, Observation] = {}

    def start(self, episodes, first):
        for i, s in first.items():
            self.last[i] = s.observation
            self.begin(i, episodes[i], s.observation)
        return {}

    def act(self, live, turn):
        return {i: self.action(i, self.last[i]) for i in live}

    def decode(self, turns, chunk):
        return {i: self.action(i, self.last[i]) for i in sorted(turns)}  # index order, as in lock step

    def observe(self, episodes, seen):
        self.last.update({i: s.observation for i, s in seen.items()})
        return set()

    def release(self, episodes, i):
        self.last.pop(i, None)

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
    Draws come from one generator seeded with `seed`, episode after episode in index order
    (lock step: the order the driver asks in), or with `per_episode` from each episode's own
    generator (seeded with `seed` and its index): the same draws in whatever order episodes
    advance, as the asynchronous driver needs to be reproducible."""

    def __init__(self, *, gold_prob: float, seed: int, per_episode: bool = False):
        super().__init__()
        self.gold_prob, self.seed, self.per_episode = gold_prob, seed, per_episode
        self.shared_rng = np.random.default_rng(seed)
        self.rngs: dict[int, np.random.Generator] = {}
        self.envs: dict[int, str] = {}
        self.tau2: dict[int, tuple[GoldPolicy, Observation]] = {}

    def begin(self, i, episode, first):
        self.envs[i] = episode.task.env
        if self.per_episode:
            self.rngs[i] = np.random.default_rng([self.seed, i])
        if episode.task.env == "tau2":  # no admissible commands: gold calls, or a probe call off the path
            self.tau2[i] = (GoldPolicy("tau2", first), first)

    def action(self, i, obs):
        p, rng = obs.privileged, self.rngs.get(i, self.shared_rng)
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
