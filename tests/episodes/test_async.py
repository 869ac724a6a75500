"""The asynchronous episode driver against lock step: the same episodes (actions, rewards, token
rows) on real envs, more episodes than sampler slots, envs in a pool answering out of order,
failures that stay their episode's, and the timings it records."""

import time

import jax
import pytest

from jaxscaffold.envs import registry
from jaxscaffold.envs.base import Observation, StepResult, Task
from jaxscaffold.envs.local import LocalEnvs
from jaxscaffold.envs.pool import EnvPool
from jaxscaffold.episodes.agents import ExplorerAgent, GoldAgent, ModelAgent, RolloutConfig, ScriptedAgent
from jaxscaffold.episodes.driver import run_episodes
from jaxscaffold.episodes.timing import Timings
from jaxscaffold.feedback import enrichers as enrichers_lib
from jaxscaffold.feedback import schedule as schedule_lib
from jaxscaffold.feedback.apply import Feedback
from jaxscaffold.models import qwen3
from jaxscaffold.rollout.engine import Sampler, SamplerOptions
from jaxscaffold.rollout.sampling import SamplingConfig
from tests.envs.test_pool import FAKE
from tests.train.configs import word_model

ROOMS = {"rooms": registry.import_path("rooms")}
# The tiny model on the rooms env's word vocabulary (~270 ids, not Qwen3's 151,936): lock step
# against async is a token-for-token property of the rows, whatever the vocabulary.
TOKENIZER, CONFIG = word_model()


def _rooms(groups, size):
    return [t for t in registry.catalogue("rooms", "train")[:groups] for _ in range(size)]


def _key(e):
    return (e.group, e.actions, e.reward, e.won, e.steps, e.truncated, e.failure, e.observations, e.feedback,
            e.conversation.ids, e.conversation.assistant_mask, e.conversation.finish_reasons,
            [r.ids for r in e.rows])


def _feedback():
    names = {"rooms"}
    enrichers = {n: e for n in names if (e := enrichers_lib.enricher(n, {"ag": "action", "oe": "full"})) is not None}
    return Feedback(schedule_lib.make("ag_early_oe_late", p=1.0, switch=5), enrichers, mode="group", run_seed=3,
                    train_step=1, num_groups=3)


@pytest.fixture(scope="module")
def params():
    return qwen3.init_params(CONFIG, jax.random.key(0))


@pytest.mark.slow  # compiles the tiny model's programs for two sampler sizes
@pytest.mark.parametrize("representation", ["trajectory", "stepwise"])
def test_async_gives_the_lockstep_episodes_with_fewer_slots(params, representation):
    """9 rooms episodes (3 groups of 3) with feedback: lock step in 9 slots, asynchronously in
    4 slots (the others queue) with envs in a pool of 3 workers: equal episodes, token for
    token. (The tiny model's rows are exact here; on other backends a batch's shape can flip a
    near tie: docs/async_rollouts.md.)"""
    tok = TOKENIZER
    tasks = _rooms(3, 3)
    groups = [i // 3 for i in range(9)]
    cfg = RolloutConfig(max_new_tokens=12, representation=representation)

    def run(rows, envs, lockstep):
        sampler = Sampler(CONFIG, stop_ids=tok.eos_ids, batch_size=rows, max_len=768,
                          options=SamplerOptions(sampling=SamplingConfig(temperature=1.0)))
        agent = ModelAgent(params, sampler, tok, cfg, seed=5, train_step=2, episode_ids=list(range(100, 109)))
        return run_episodes(agent, envs, tasks, groups, max_turns=3, feedback=_feedback(), lockstep=lockstep,
                            decode_chunk=5)

    reference = run(9, LocalEnvs({"rooms": registry.factory("rooms")}), True)
    with EnvPool(3, factories=ROOMS) as pool:
        asynchronous = run(4, pool, False)
    assert [_key(e) for e in asynchronous] == [_key(e) for e in reference]
    assert all(e.steps == 3 and e.truncated and e.failure is None for e in reference)
    assert any(e.feedback for e in reference)  # feedback took part
    with pytest.raises(ValueError, match="do not fit"):
        run(4, LocalEnvs({"rooms": registry.factory("rooms")}), True)


def test_scripted_agents_in_a_pool_play_as_in_lockstep():
    """Gold and (per-episode seeded) explorer episodes: a pool answering out of order,
    asynchronously, gives the in-process lock-step episodes."""
    tasks = _rooms(4, 2)
    local = LocalEnvs({"rooms": registry.factory("rooms")})
    with EnvPool(3, factories=ROOMS) as pool:
        for make in (GoldAgent, lambda: ExplorerAgent(gold_prob=0.5, seed=7, per_episode=True)):
            reference = run_episodes(make(), local, tasks, max_turns=14, lockstep=True)
            asynchronous = run_episodes(make(), pool, tasks, max_turns=14, max_live=3)
            assert [_key(e) for e in asynchronous] == [_key(e) for e in reference]
    assert all(e.won for e in run_episodes(GoldAgent(), local, tasks, max_turns=14))


class _Scripted(ScriptedAgent):
    """Says what the task's spec says, each step."""

    def action(self, i, obs):
        return self.say[i]

    def begin(self, i, episode, first):
        self.say = getattr(self, "say", {})
        self.say[i] = episode.task.spec["say"]


def test_a_failing_env_fails_only_its_episode():
    """A crash, an env error and a failed reset end their episodes; the others finish (an
    episode that shared the crashed worker is lost with it: a counted failure, as in `step`)."""
    tasks = [Task("fake", f"t{i}", "x", spec={"say": "ok"}) for i in range(6)]
    tasks[1] = Task("fake", "t1", "x", spec={"say": "crash"})
    tasks[4] = Task("fake", "t4", "x", spec={"say": "raise"})
    tasks.append(Task("fake", "t6", "x", spec={"say": "ok", "fail_reset": True}))
    with EnvPool(3, step_timeout_s=5.0, factories=FAKE) as pool:
        eps = run_episodes(_Scripted(), pool, tasks, max_turns=5, max_live=4)
        assert pool.stats["crashes"] == 1 and pool.stats["env_errors"] == 2
    assert "died" in eps[1].failure and "boom" in eps[4].failure and "on purpose" in eps[6].failure
    others = [e for i, e in enumerate(eps) if i not in (1, 4, 6)]
    assert all((e.failure is None and e.steps == 3 and e.reward == 6.0) or "restarted" in e.failure for e in others)
    assert sum(e.failure is None for e in others) >= 2


class SlowEnv:
    """A latency env (tests): each reset and step sleeps its task's `delay_s`; 3 steps."""

    name = "slow"

    def reset(self, task):
        self.delay, self.n = task.spec["delay_s"], 0
        time.sleep(self.delay)
        return Observation("go")

    def step(self, text):
        time.sleep(self.delay)
        self.n += 1
        return StepResult(Observation(f"step {self.n}"), 1.0, self.n >= 3, {})

    def close(self):
        pass


def test_episodes_overlap_their_env_time_and_the_timings_say_so():
    """8 episodes of 4 env calls of 0.2 s each on 8 workers: the episodes' env calls overlap
    (the wall clock is a fraction of the env seconds summed over episodes)."""
    tasks = [Task("slow", f"t{i}", "x", spec={"delay_s": 0.2, "say": "a"}) for i in range(8)]
    with EnvPool(8, factories={"slow": "tests.episodes.test_async:SlowEnv"}) as pool:
        run_episodes(_Scripted(), pool, tasks[:1], max_turns=1)  # the workers have started
        t = Timings()
        eps = run_episodes(_Scripted(), pool, tasks, max_turns=5, timings=t)
    assert all(e.steps == 3 and e.reward == 3.0 for e in eps)
    assert t.env_s >= 8 * 4 * 0.2 * 0.9
    assert t.wall_s < t.env_s / 3  # the episodes' env time overlapped
    assert 0.0 <= t.idle_share <= 1.0 and t.busy_s <= t.wall_s
    s = t.stats()
    assert set(s) == {"time/decode_s", "time/prefill_s", "time/env_s", "time/rollout_idle_share"}


class _CountingGold(GoldAgent):
    """The gold agent with two places, recording each prefill's (first prompts, observations)."""

    capacity = 2

    def __init__(self):
        super().__init__()
        self.prefills, self.decodes = [], 0

    def prefill(self, episodes, first, seen):
        self.prefills.append((sorted(first), sorted(seen)))
        return super().prefill(episodes, first, seen)

    def decode(self, turns, chunk):
        self.decodes += 1
        return super().decode(turns, chunk)


def test_one_prefill_an_iteration_takes_new_episodes_with_the_observations():
    """5 gold episodes through 2 places: every iteration prefills once, before its decode
    chunk, and an episode admitted into a freed place shares that prefill with the
    observations that came back; the episodes are the lock-step ones."""
    tasks = _rooms(5, 1)
    local = LocalEnvs({"rooms": registry.factory("rooms")})
    agent = _CountingGold()
    eps = run_episodes(agent, local, tasks, max_turns=14)
    reference = run_episodes(GoldAgent(), local, tasks, max_turns=14, lockstep=True)
    assert [_key(e) for e in eps] == [_key(e) for e in reference]
    assert all(e.won for e in eps)
    assert sorted(i for first, _ in agent.prefills for i in first) == list(range(5))  # each admitted once
    assert len(agent.prefills) <= agent.decodes  # never two prefills without a decode between
    assert any(first and seen for first, seen in agent.prefills)  # admissions joined observations
