"""The episode loop: one agent, a batch of environments, every episode run to its end.

  reset -> the agent starts on what it is shown -> up to `max_turns` times: the agent acts,
  the env steps, the episode records reward / action / observation, feedback decides what
  the agent is shown next, the agent observes it

Asynchronous (the default), each episode advances on its own: resets run ahead and in
parallel (the pool's `submit_reset`); an episode whose env has reset takes a free place of the
agent (a sampler slot) and starts decoding; the agent decodes every ready row `decode_chunk`
tokens at a time, and a turn that ends goes to its env at once; the observations that came
back and the first prompts of newly admitted episodes are prefilled together (one sampler call
an iteration) and their rows join the next chunk; a finished episode frees its place for the
next pending one. So a call may hold more episodes than the agent has places (a whole
training step, an evaluation). Lock step (`lockstep=True`, the reference) decodes every live
episode, then steps every env, then prefills every observation, turn after turn.

A row's tokens depend on its own seed and position (`seeds.turn_seed`, the sampler's keys),
feedback decisions on (group, rollout, episode step): both ways give the same episodes, up to
the numerics a batch's shape can change (which rows share a decode or prefill, the cache
window its longest row needs); docs/async_rollouts.md measures how often.

Training rollouts, evaluation, RWML's trajectories and the gold policy all run here; the
agents (`agents`) differ, the loop does not. `complete` (one assistant turn per prompt, no
env) sits next to it.
"""

from __future__ import annotations

import collections
import time
from typing import Sequence

from jaxscaffold.envs.base import EnvBatch, Observation, Task, is_failure
from jaxscaffold import seeds
from jaxscaffold.episodes.agents import Agent, Seen
from jaxscaffold.episodes.episode import Episode
from jaxscaffold.episodes.timing import Timings
from jaxscaffold.feedback.apply import NONE, Feedback
from jaxscaffold.models.tokenizer import Tokenizer
from jaxscaffold.rollout.conversation import Conversation, MultiTurn
from jaxscaffold.rollout.engine import Sampler

DECODE_CHUNK = 16  # tokens a ready row decodes between admissions (rollout.decode_chunk)
ADMIT_WAIT_MS = 500.0  # how long reset episodes may wait for others to be admitted with (rollout.admit_wait_ms)


def run_episodes(agent: Agent, envs: EnvBatch, tasks: Sequence[Task], groups: Sequence[int] | None = None, *,
                 max_turns: int, feedback: Feedback = NONE, timings: Timings | None = None,
                 lockstep: bool = False, decode_chunk: int = DECODE_CHUNK,
                 max_live: int | None = None, admit_wait_ms: float = ADMIT_WAIT_MS) -> list[Episode]:
    """Runs one episode per task to the end: the env says done, the agent has no room for
    another turn, or `max_turns` actions were taken (both: `truncated`). Failures (the env's,
    or a first prompt the agent cannot take) end an episode with `failure` set.

    `groups[i]` (default i) is episode i's GRPO group: rollouts of a group share task and
    seed and, under group randomisation, the same feedback decisions.

    Asynchronous (the default): every episode advances on its own (see the module), so there
    may be more tasks than the agent has slots (`agent.capacity`); the agent decodes the
    ready rows `decode_chunk` tokens at a time between admissions. `lockstep=True`: all
    episodes step together, turn by turn (at most `agent.capacity` of them): the reference.
    Both give the same episodes up to numerics that the batch's shape can change.
    `max_live` (asynchronous) bounds the episodes holding an env at once (reset ahead or
    running; default: twice the agent's places, every episode for a scripted agent).
    `admit_wait_ms` (asynchronous): while rows are decoding, an episode whose env has reset
    waits up to this long for the other resets in flight that would take a free place with it,
    so first prompts are prefilled together rather than one call each (0: admitted at once).

    `timings` (optional) adds up where the time went (`timing.Timings`)."""
    timings = Timings() if timings is None else timings
    started = time.perf_counter()
    groups = list(range(len(tasks))) if groups is None else list(groups)
    episodes = [Episode(task, g, Conversation()) for task, g in zip(tasks, groups)]
    rollout = [0] * len(groups)  # each episode's index in its group
    seen_in_group: dict[int, int] = {}
    for i, g in enumerate(groups):
        rollout[i] = seen_in_group.get(g, 0)
        seen_in_group[g] = rollout[i] + 1
    # each env learns at reset what feedback its episode is planned to get (see Feedback.prepare)
    planned = [feedback.prepare(t, group=g, rollout=r) for t, g, r in zip(tasks, groups, rollout)]
    if lockstep:
        _lockstep(agent, envs, episodes, planned, rollout, max_turns, feedback, timings)
    else:
        _asynchronous(agent, envs, episodes, planned, rollout, max_turns, feedback, timings, decode_chunk, max_live,
                      admit_wait_ms / 1000)
    timings.wall_s += time.perf_counter() - started
    return episodes


def _seen(episodes: list[Episode], rollout: list[int], feedback: Feedback, i: int, obs: Observation) -> Seen:
    """What episode i is shown of `obs` (feedback decides), recording the feedback applied."""
    ep = episodes[i]
    shown = feedback.show(obs, env=ep.task.env, group=ep.group, rollout=rollout[i], episode_step=ep.steps,
                          actions=ep.actions)
    ep.feedback += [(ep.steps, kind) for kind in shown.applied]
    return Seen(obs, shown.text)


def _record_step(ep: Episode, action: str, res) -> bool:
    """Records one env answer in its episode; True when the episode goes on."""
    if is_failure(res):
        ep.actions.append(action.strip())
        ep.failure, ep.done = res.reason, True
        return False
    ep.actions.append(res.action if res.action is not None else action.strip())
    ep.steps += 1
    ep.observations.append(res.observation.text)
    ep.reward += float(res.reward)
    ep.won = ep.won or bool(res.info.get("won", False))
    if res.done:
        ep.done = True
        if not ep.won and res.info.get("failure"):  # the env's own reason for a lost episode
            ep.end_reason = ": ".join(str(x) for x in (res.info["failure"], res.info.get("failure_message")) if x)
        return False
    return True


def _lockstep(agent, envs, episodes, planned, rollout, max_turns, feedback, timings) -> None:
    """Every live episode decodes, then every env steps, then every observation is prefilled."""
    capacity = getattr(agent, "capacity", None)
    if capacity is not None and len(episodes) > capacity:
        raise ValueError(f"{len(episodes)} episodes do not fit the agent's {capacity} slots in lock step")
    first = {}
    t0 = time.perf_counter()
    reset = envs.reset(planned)
    timings.env_s += (time.perf_counter() - t0) * len(planned)
    for i, obs in enumerate(reset):
        if is_failure(obs):
            episodes[i].failure, episodes[i].done = obs.reason, True
            continue
        episodes[i].observations.append(obs.text)
        first[i] = _seen(episodes, rollout, feedback, i, obs)
    with timings.accelerator("prefill"):
        failed = agent.start(episodes, first)
    for i, reason in failed.items():
        episodes[i].failure, episodes[i].done = reason, True

    for turn in range(max_turns):
        live = [i for i, ep in enumerate(episodes) if not ep.done]
        if not live:
            break
        with timings.accelerator("decode"):
            actions = agent.act(live, turn)
        t0 = time.perf_counter()
        results = envs.step(actions)
        timings.env_s += (time.perf_counter() - t0) * len(actions)
        nxt = {i: _seen(episodes, rollout, feedback, i, results[i].observation)
               for i in live if _record_step(episodes[i], actions[i], results[i])}
        with timings.accelerator("prefill"):
            full = agent.observe(episodes, nxt)
        for i in full:
            episodes[i].done = episodes[i].truncated = True
    for ep in episodes:
        if not ep.done:
            ep.done = ep.truncated = True
    agent.finish(episodes)


class _EnvsAtOnce:
    """The asynchronous env interface over a plain `EnvBatch` (e.g. `LocalEnvs`): every
    episode resets in one call at `open`, and a submitted step runs at once, in this thread."""

    def __init__(self, envs: EnvBatch):
        self.envs = envs
        self.ready: dict[int, object] = {}

    def open(self, tasks):
        self.reset = self.envs.reset(tasks)

    def submit_reset(self, i):
        self.ready[i] = self.reset[i]

    def submit_step(self, i, text):
        self.ready[i] = self.envs.step({i: text})[i]

    def poll(self, timeout_s):
        out, self.ready = self.ready, {}
        return out

    def end(self, i):
        pass


def _ema(estimate: float | None, x: float, weight: float = 0.2) -> float:
    return x if not estimate else (1 - weight) * estimate + weight * x


def _asynchronous(agent, envs, episodes, planned, rollout, max_turns, feedback, timings, decode_chunk,
                  max_live, admit_wait_s) -> None:
    """The event loop (see the module): admit reset episodes into free places, decode one
    chunk of the ready rows, hand ended turns to their envs, take whatever the envs answered."""
    if decode_chunk < 1 or (max_live is not None and max_live < 1):
        raise ValueError(f"decode_chunk={decode_chunk} and max_live={max_live} must be at least 1")
    if admit_wait_s < 0:
        raise ValueError(f"admit_wait_ms={admit_wait_s * 1000:g} must be at least 0")
    n = len(episodes)
    capacity = getattr(agent, "capacity", None) or max(n, 1)
    live_limit = 2 * capacity if max_live is None else max_live  # resets run ahead of the places up to this
    capacity = min(capacity, live_limit)
    env = envs if hasattr(envs, "submit_step") else _EnvsAtOnce(envs)
    t0 = time.perf_counter()
    env.open(planned)  # the adapter resets every episode here, each waiting for the whole call
    timings.env_s += (time.perf_counter() - t0) * (0 if env is envs else n)
    to_reset = collections.deque(range(n))  # not yet handed to its env
    admitted: set[int] = set()  # holding an agent place
    waiting: list[tuple[int, Seen]] = []  # reset, waiting for a place
    reset_at: dict[int, float] = {}  # a waiting episode -> when its reset came back
    decoding: dict[int, int] = {}  # episode -> its turn (the actions taken so far)
    sent: dict[int, tuple[float, str | None]] = {}  # at the env: (when, action; None: a reset)

    def submit_resets():  # ahead of the places: their envs are ready when a place frees
        while to_reset and len(admitted) + len(waiting) + sum(a is None for _, a in sent.values()) < live_limit:
            i = to_reset.popleft()
            sent[i] = (time.perf_counter(), None)
            env.submit_reset(i)

    def end(i: int) -> None:
        ep = episodes[i]
        ep.done = True
        if i in admitted:
            admitted.discard(i)
            agent.release(episodes, i)
        decoding.pop(i, None)
        env.end(i)

    chunk_s, step_s = 0.0, None  # running estimates: a decode chunk's and an env step's seconds
    submit_resets()
    while to_reset or waiting or sent or decoding:
        # 1. Whatever the envs answered: all there is now when rows can decode; else wait for
        # one, then for the steps expected back within half a chunk (rows that ended a turn
        # together rejoin together instead of scattering over chunks that each serve few rows).
        answers, timed = {}, set()
        if sent:
            wait_s = 0.0 if decoding else None
            answers = env.poll(wait_s)
            timed = set(answers) if wait_s is None else set()  # polled answers may have waited out a chunk
            now = time.perf_counter()
            soon = [when + step_s for when, action in sent.values()
                    if action is not None and step_s is not None and when + step_s <= now + chunk_s / 2]
            while not decoding and soon and len(answers) < len(soon) and time.perf_counter() < max(soon):
                more = env.poll(max(0.0, max(soon) - time.perf_counter()))
                if not more:
                    break
                answers.update(more)
                timed.update(more)
        now = time.perf_counter()
        nxt = {}
        for i in sorted(answers):
            when, action = sent.pop(i)
            timings.env_s += now - when
            if action is not None and i in timed:
                step_s = _ema(step_s, now - when)
            res, ep = answers[i], episodes[i]
            if action is None:  # a reset
                if is_failure(res):
                    ep.failure = res.reason
                    end(i)
                else:
                    ep.observations.append(res.text)
                    waiting.append((i, _seen(episodes, rollout, feedback, i, res)))
                    reset_at[i] = now
            elif _record_step(ep, action, res):
                nxt[i] = _seen(episodes, rollout, feedback, i, res.observation)
            else:
                end(i)
        # 2. One prefill: reset episodes admitted into free places (in index order) and the
        # observations that came back. While rows decode, reset episodes wait (up to
        # admit_wait_s) for the resets in flight that would take a free place with them: resets
        # end at scattered times, and a first prompt prefilled alone costs a call of its own.
        free, first = capacity - len(admitted), {}
        if waiting and free > 0 and decoding and admit_wait_s > 0:
            coming = sum(action is None for _, action in sent.values())
            if len(waiting) < min(free, len(waiting) + coming) and now < min(reset_at.values()) + admit_wait_s:
                free = 0  # held: the next iteration looks again
        if waiting and free > 0:
            waiting.sort(key=lambda x: x[0])
            first, waiting = dict(waiting[:free]), waiting[free:]
            admitted.update(first)
            for i in first:
                del reset_at[i]
        if first or nxt:
            with timings.accelerator("prefill"):
                failed, full = agent.prefill(episodes, first, nxt)
            for i in first:
                if i in failed:
                    episodes[i].failure = failed[i]
                    end(i)
                elif max_turns <= 0:
                    episodes[i].truncated = True
                    end(i)
                else:
                    decoding[i] = 0
            for i in nxt:
                if i in full or len(episodes[i].actions) >= max_turns:
                    episodes[i].truncated = True
                    end(i)
                else:
                    decoding[i] = len(episodes[i].actions)
        submit_resets()
        # 3. One decode chunk of every ready row; the turns that ended go to their envs.
        if decoding:
            t0 = time.perf_counter()
            with timings.accelerator("decode"):
                actions = agent.decode(dict(decoding), decode_chunk)
            chunk_s = _ema(chunk_s, time.perf_counter() - t0)
            for i, text in actions.items():
                del decoding[i]
                sent[i] = (time.perf_counter(), text)
                env.submit_step(i, text)


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
                           seeds=[seeds.turn_seed(seed, 0, first_row + start + i, 0) for i in slots])
        for i in slots:
            text = tokenizer.decode([t for t in gens[i].tokens if t not in tokenizer.eos_ids])
            out.append((mt.conversations[i], text))
    return out
