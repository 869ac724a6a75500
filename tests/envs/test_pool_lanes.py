"""EnvPool's lanes: the env instances of one worker serve their requests concurrently (one
thread each), one episode's requests in order, a serial env's instances one at a time; a
hung env holds only its own episode until its timeout, an env error only its own instance."""

import threading
import time

import pytest

from jaxscaffold.envs.base import Observation, StepResult
from jaxscaffold.envs.pool import EnvPool
from tests.envs.test_pool import FAKE, _alive, _java_descendants, _tasks
from tests.envs.test_pool_async import _children, _collect

psutil = pytest.importorskip("psutil")


@pytest.fixture
def one_worker():
    with EnvPool(1, step_timeout_s=4.0, reset_timeout_s=30.0, factories=FAKE, close_timeout_s=3.0,
                 env_kwargs={"fake": {"done_after": 1000}}) as p:
        yield p


def _open(pool, n):
    pool.open(_tasks(n))
    for i in range(n):
        pool.submit_reset(i)
    obs = _collect(pool, n)
    assert all(isinstance(obs[i], Observation) for i in range(n))
    assert {pool.episode_worker(i) for i in range(n)} == {0}  # all in the one worker


def test_two_waiting_envs_of_one_worker_overlap(one_worker):
    """Two 1 s steps in one worker take about 1 s, not 2 (a loaded machine gets a wide margin),
    through both interfaces."""
    pool = one_worker
    _open(pool, 2)
    t = time.monotonic()
    pool.submit_step(0, "sleep:1.0")
    pool.submit_step(1, "sleep:1.0")
    r = _collect(pool, 2)
    took = time.monotonic() - t
    assert all(isinstance(r[i], StepResult) for i in (0, 1)) and took < 0.75 * 2.0, took
    pool.reset(_tasks(2))  # the batched interface
    t = time.monotonic()
    r = pool.step({0: "sleep:1.0", 1: "sleep:1.0"})
    took = time.monotonic() - t
    assert r[0].observation.text == "t0:sleep:1.0:1" == r[1].observation.text and took < 0.75 * 2.0, took


def test_a_serial_env_takes_turns_in_arrival_order():
    """`serial_envs` (the registry's `EnvSpec.concurrent` false): one worker runs that env's
    requests one at a time, in the order they came."""
    with EnvPool(1, step_timeout_s=10.0, factories=FAKE, serial_envs=("fake",)) as pool:
        _open(pool, 2)
        t = time.monotonic()
        pool.submit_step(0, "sleep:1.0")
        pool.submit_step(1, "x")
        came = {}
        while len(came) < 2 and time.monotonic() - t < 30:
            came.update({i: (time.monotonic(), r) for i, r in pool.poll(1.0).items()})
        assert all(isinstance(r, StepResult) for _, r in came.values())
        assert came[1][0] - t >= 0.9 and came[1][0] >= came[0][0]  # the quick step waited for the slow one


def test_one_episodes_requests_stay_in_order_beside_others(one_worker):
    """Four episodes of one worker stepping with uneven latencies: each one's observations
    count its own steps and carry its own actions, in the order sent."""
    pool = one_worker
    _open(pool, 4)
    delays = {0: "0.3", 1: "0.0", 2: "0.15", 3: "0.05"}
    steps = 6
    sent = {i: [] for i in range(4)}
    got = {i: [] for i in range(4)}
    for i in range(4):
        sent[i].append(f"sleep:{delays[i]}:a{len(sent[i])}")
        pool.submit_step(i, sent[i][-1])
    until = time.monotonic() + 60
    while any(len(got[i]) < steps for i in range(4)) and time.monotonic() < until:
        for i, r in pool.poll(1.0).items():
            got[i].append(r.observation.text)
            if len(sent[i]) < steps:
                sent[i].append(f"sleep:{delays[i]}:a{len(sent[i])}")
                pool.submit_step(i, sent[i][-1])
    task = {0: "t0", 1: "t0", 2: "t1", 3: "t1"}
    assert got == {i: [f"{task[i]}:{a}:{n + 1}" for n, a in enumerate(sent[i])] for i in range(4)}


def test_a_hung_env_holds_only_its_episode_until_its_timeout(one_worker):
    """One worker, one env hung, one healthy: the healthy episode's steps keep answering
    promptly until the hung one's timeout; then the worker is killed: the hung request fails
    as a timeout, the healthy one as lost (at once if in flight, else at its next step)."""
    pool = one_worker
    _open(pool, 2)
    pid = pool.worker_pids()[0]
    t = time.monotonic()
    pool.submit_step(0, "hang")
    healthy, out = 0, {}
    while 0 not in out and time.monotonic() - t < 30:
        pool.submit_step(1, "sleep:0.2")
        out = _collect(pool, 1, timeout_s=30)
        if isinstance(out.get(1), StepResult):
            healthy += 1
    waited = time.monotonic() - t
    assert out[0].kind == "timeout" and 4.0 <= waited < 20, waited
    assert healthy >= 3  # ~20 in the 4 s timeout at 0.2 s a step; 0 if it waited behind the hang
    lost = out.get(1) or _collect(pool, 1)[1]  # in flight when the worker died: reported with it
    assert lost.kind == "lost" and pool.stats["failures_lost"] == 1 and pool.stats["timeouts"] == 1
    assert pool.worker_pids()[0] != pid and not _alive(pid)
    _open(pool, 2)  # the restarted worker serves a new batch


def test_an_env_error_discards_only_its_instance(one_worker):
    pool = one_worker
    _open(pool, 3)
    pid = pool.worker_pids()[0]
    pool.submit_step(0, "raise")
    pool.submit_step(1, "sleep:0.3")
    pool.submit_step(2, "a")
    r = _collect(pool, 3)
    assert r[0].kind == "error" and "boom" in r[0].reason
    assert r[1].observation.text == "t0:sleep:0.3:1" and r[2].observation.text == "t1:a:1"
    pool.submit_step(2, "b")  # the others' envs go on in the same worker
    assert _collect(pool, 1)[2].observation.text == "t1:b:2" and pool.worker_pids() == [pid]
    pool.end(1), pool.end(2)
    obs = pool.reset(_tasks(3))  # the discarded instance is rebuilt
    assert all(isinstance(o, Observation) for o in obs) and pool.stats["env_errors"] == 1


def test_close_with_busy_lanes_leaves_no_worker_or_thread():
    threads, before = threading.active_count(), set(_children())
    pool = EnvPool(2, step_timeout_s=30.0, factories=FAKE, close_timeout_s=3.0)
    pool.open(_tasks(6))
    for i in range(6):
        pool.submit_reset(i)
    _collect(pool, 6)
    pool.submit_step(0, "hang")  # lanes busy when the pool closes: one hung, others sleeping
    for i in range(1, 6):
        pool.submit_step(i, "sleep:5")
    pids = pool.worker_pids()
    t = time.monotonic()
    pool.close()
    assert time.monotonic() - t < 30
    time.sleep(0.5)
    assert not any(_alive(p) for p in pids)
    assert set(_children()) <= before and threading.active_count() == threads


def _sciworld_steps(pool, episodes, gold, turns):
    """Steps `episodes` through their first `turns` gold actions, all at once each turn."""
    texts = {i: [] for i in episodes}
    for t in range(turns):
        for i in episodes:
            pool.submit_step(i, f"<action>{gold[t]}</action>")
        r = _collect(pool, len(episodes), timeout_s=120)
        for i in episodes:
            assert isinstance(r[i], StepResult), r[i]
            texts[i].append(r[i].observation.text)
    return texts


@pytest.mark.slow
def test_sciworld_episodes_of_one_worker_step_concurrently_as_alone():
    """Two ScienceWorld episodes (two JVMs) in one worker, stepped at once, see what one
    episode sees alone; closing leaves no JVM."""
    pytest.importorskip("scienceworld")
    from jaxscaffold.envs.sciworld import make_task

    task = make_task("find-animal", 0, "train")
    with EnvPool(1, env_kwargs={"sciworld": {"step_limit": 30}}) as pool:
        pool.open([task])
        pool.submit_reset(0)
        alone_obs = _collect(pool, 1, timeout_s=180)[0]
        gold = alone_obs.privileged["gold_actions"]
        turns = min(4, len(gold) - 1)
        alone = _sciworld_steps(pool, [0], gold, turns)[0]
        pool.end(0)
        pool.open([task, task])
        for i in (0, 1):
            pool.submit_reset(i)
        obs = _collect(pool, 2, timeout_s=180)
        assert obs[0].text == obs[1].text == alone_obs.text
        together = _sciworld_steps(pool, [0, 1], gold, turns)
        assert together[0] == alone and together[1] == alone
        assert len(_java_descendants()) == 2  # one JVM per instance (the first one's reused)
    time.sleep(0.5)
    assert _java_descendants() == []
