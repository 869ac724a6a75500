"""EnvPool's asynchronous interface (open / submit_reset / submit_step / poll / end): answers
as they come, a slow env holding only its own episode, and every failure kind of `step`."""

import threading
import time

import pytest

from jaxscaffold.envs.base import Observation, StepResult, Task, is_failure
from jaxscaffold.envs.pool import EnvPool
from tests.envs.test_pool import FAKE, _alive, _tasks

psutil = pytest.importorskip("psutil")


@pytest.fixture
def pool():
    with EnvPool(2, step_timeout_s=3.0, reset_timeout_s=30.0, factories=FAKE) as p:
        yield p


def _collect(pool, n, timeout_s=60.0):
    """Polls until `n` answers came (episode -> answer)."""
    out, until = {}, time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < until:
        out.update(pool.poll(1.0))
    return out


def test_answers_come_as_they_are_ready_and_episodes_stay_apart(pool):
    pool.open(_tasks(4))
    for i in range(4):
        pool.submit_reset(i)
    obs = _collect(pool, 4)
    assert [obs[i].text for i in range(4)] == ["start t0", "start t0", "start t1", "start t1"]
    assert len({obs[i].privileged["pid"] for i in range(4)}) == 2  # spread over both workers
    pool.submit_step(0, "a")
    r = _collect(pool, 1)
    assert r[0].observation.text == "t0:a:1"
    for i in range(4):
        pool.submit_step(i, "b")
    r = _collect(pool, 4)
    assert [r[i].observation.text for i in range(4)] == ["t0:b:2", "t0:b:1", "t1:b:1", "t1:b:1"]
    assert pool.poll(0.0) == {}  # nothing more is due
    with pytest.raises(ValueError):
        pool.submit_step(9, "x")


def test_a_finished_episode_frees_its_env_for_the_next_one(pool):
    """Episodes end (done, or `end`) and new ones of the batch reuse the worker's instances:
    a worker never holds more env instances than its episodes in flight."""
    pool.open(_tasks(6))
    for i in range(2):
        pool.submit_reset(i)
    _collect(pool, 2)
    for _ in range(3):  # FakeEnv ends after 3 steps
        pool.submit_step(0, "a")
        r = _collect(pool, 1)
    assert r[0].done
    with pytest.raises(ValueError):
        pool.submit_step(0, "again")
    pool.end(1)
    for i in range(2, 6):
        pool.submit_reset(i)
    obs = _collect(pool, 4)
    assert all(isinstance(o, Observation) for o in obs.values())
    assert pool.stats["resets"] == 6


def test_a_hung_env_fails_its_episode_and_the_others_go_on(pool):
    pool.open(_tasks(4))
    for i in range(4):
        pool.submit_reset(i)
    _collect(pool, 4)
    pids = pool.worker_pids()
    hung = [i for i in range(4) if pool.episode_worker(i) == 0][0]
    same_worker = [i for i in range(4) if pool.episode_worker(i) == 0 and i != hung][0]
    other = [i for i in range(4) if pool.episode_worker(i) == 1]
    t = time.monotonic()
    pool.submit_step(hung, "hang")
    for i in other:
        pool.submit_step(i, "ok")
    r = _collect(pool, 3, timeout_s=20)
    assert time.monotonic() - t < 15
    assert r[hung].kind == "timeout" and all(isinstance(r[i], StepResult) for i in other)
    assert pool.stats["timeouts"] == 1 and pool.worker_pids()[0] != pids[0]
    pool.submit_step(same_worker, "x")  # lived in the restarted worker: lost, reported at its next step
    assert _collect(pool, 1)[same_worker].kind == "lost"
    assert not _alive(pids[0])


def test_crash_error_and_failed_reset(pool):
    pool.open(_tasks(4) + _tasks(1, fail_reset=True))
    for i in range(5):
        pool.submit_reset(i)
    obs = _collect(pool, 5)
    assert obs[4].kind == "error" and all(isinstance(obs[i], Observation) for i in range(4))
    crash = 0
    raising = [i for i in range(4) if pool.episode_worker(i) != pool.episode_worker(crash)][0]
    pool.submit_step(crash, "crash")
    pool.submit_step(raising, "raise")
    r = _collect(pool, 2)
    assert r[crash].kind == "crash" and r[raising].kind == "error" and "boom" in r[raising].reason
    assert pool.stats["crashes"] == 1 and pool.stats["env_errors"] == 2
    pool.submit_step(raising, "again")  # a failed episode answers with its failure
    assert _collect(pool, 1)[raising].kind == "error"


def _children():
    """This process's live children, but multiprocessing's own resource tracker."""
    out = []
    for c in psutil.Process().children(recursive=True):
        try:
            if _alive(c.pid) and "resource_tracker" not in " ".join(c.cmdline()):
                out.append(c.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def test_close_leaves_no_worker_or_thread_behind():
    threads, before = threading.active_count(), set(_children())  # other tests' children (wandb's service) stay
    pool = EnvPool(3, step_timeout_s=3.0, factories=FAKE)
    pool.open(_tasks(6))
    for i in range(6):
        pool.submit_reset(i)
    _collect(pool, 6)
    pool.submit_step(0, "hang")  # a request still in flight when the pool closes
    pids = pool.worker_pids()
    pool.close()
    time.sleep(0.5)
    assert not any(_alive(p) for p in pids)
    assert set(_children()) <= before and threading.active_count() == threads
    with pytest.raises(RuntimeError):
        pool.poll(0.0)
