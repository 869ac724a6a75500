"""The episode loop: one agent, one batch of environments, stepped together to the end.

  reset -> the agent starts on what it is shown -> up to `max_turns` times: the agent acts,
  the envs step, the episodes record reward / actions / observations, feedback decides what
  the agent is shown next, the agent observes it

Training rollouts, evaluation, RWML's trajectories and the gold policy all run here; the
agents (`agents`) differ, the loop does not. `complete` (one assistant turn per prompt, no
env) sits next to it.
"""

from __future__ import annotations

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


def run_episodes(agent: Agent, envs: EnvBatch, tasks: Sequence[Task], groups: Sequence[int] | None = None, *,
                 max_turns: int, feedback: Feedback = NONE, timings: Timings | None = None) -> list[Episode]:
    """Runs one episode per task to the end: the env says done, the agent has no room for
    another turn, or `max_turns` actions were taken (both: `truncated`). Failures (the env's,
    or a first prompt the agent cannot take) end an episode with `failure` set.

    `groups[i]` (default i) is episode i's GRPO group: rollouts of a group share task and
    seed and, under group randomisation, the same feedback decisions.

    `timings` (optional) adds up where the time went (`timing.Timings`)."""
    timings = Timings() if timings is None else timings
    started = time.perf_counter()
    groups = list(range(len(tasks))) if groups is None else list(groups)
    episodes = [Episode(task, g, Conversation()) for task, g in zip(tasks, groups)]
    rollout = [groups[:i].count(g) for i, g in enumerate(groups)]  # each episode's index in its group

    def seen(i: int, obs: Observation) -> Seen:
        ep = episodes[i]
        shown = feedback.show(obs, env=ep.task.env, group=ep.group, rollout=rollout[i], episode_step=ep.steps,
                              actions=ep.actions)
        ep.feedback += [(ep.steps, kind) for kind in shown.applied]
        return Seen(obs, shown.text)

    first = {}
    # each env learns at reset what feedback its episode is planned to get (see Feedback.prepare)
    planned = [feedback.prepare(t, group=g, rollout=r) for t, g, r in zip(tasks, groups, rollout)]
    t0 = time.perf_counter()
    reset = envs.reset(planned)
    timings.env_s += (time.perf_counter() - t0) * len(planned)
    for i, obs in enumerate(reset):
        if is_failure(obs):
            episodes[i].failure, episodes[i].done = obs.reason, True
            continue
        episodes[i].observations.append(obs.text)
        first[i] = seen(i, obs)
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
        nxt = {}
        for i in live:
            ep, res = episodes[i], results[i]
            if is_failure(res):
                ep.actions.append(actions[i].strip())
                ep.failure, ep.done = res.reason, True
                continue
            ep.actions.append(res.action if res.action is not None else actions[i].strip())
            ep.steps += 1
            ep.observations.append(res.observation.text)
            ep.reward += float(res.reward)
            ep.won = ep.won or bool(res.info.get("won", False))
            if res.done:
                ep.done = True
                continue
            nxt[i] = seen(i, res.observation)
        with timings.accelerator("prefill"):
            full = agent.observe(episodes, nxt)
        for i in full:
            episodes[i].done = episodes[i].truncated = True
    for ep in episodes:
        if not ep.done:
            ep.done = ep.truncated = True
    agent.finish(episodes)
    timings.wall_s += time.perf_counter() - started
    return episodes


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
