"""EnvPool: concurrency, G separate rollouts, crash / hang recovery, clean shutdown."""

import os
import signal
import threading
import time

import pytest

from jaxscaffold.envs.base import EnvError, EpisodeFailure, Observation, StepResult, Task, is_failure
from jaxscaffold.envs.pool import EnvPool

psutil = pytest.importorskip("psutil")

FAKE = {"fake": "tests.envs.test_pool:FakeEnv"}


class FakeEnv:
    """Registered only in these tests (resolved by import path inside the workers)."""

    name = "fake"
    POOL_METHODS = ("pid",)

    def __init__(self, done_after: int = 3):
        self.done_after = done_after
        self.n = 0
        self.task = None

    def reset(self, task: Task) -> Observation:
        if task.spec.get("fail_reset"):
            raise EnvError("reset failed on purpose")
        self.task, self.n = task, 0
        return Observation(text=f"start {task.task_id}", privileged={"pid": os.getpid()})

    def step(self, text: str) -> StepResult:
        self.n += 1
        if text.startswith("sleep:"):  # a latency-bound env: waits without using a core
            time.sleep(float(text.split(":")[1]))
        if text == "hang":
            time.sleep(3600)
        if text == "crash":
            os._exit(3)
        if text == "raise":
            raise EnvError("boom")
        if text == "unpicklable":  # e.g. an env that puts a lock or a generator in `info`
            return StepResult(Observation(text="x"), reward=0.0, done=False, info={"lock": threading.Lock()})
        return StepResult(Observation(text=f"{self.task.task_id}:{text}:{self.n}"),
                          reward=float(self.n), done=self.n >= self.done_after,
                          info={"pid": os.getpid()})

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        pass


def _tasks(n, **spec):
    return [Task(env="fake", task_id=f"t{i // 2}", split="x", spec=spec) for i in range(n)]


@pytest.fixture
def fake_pool():
    with EnvPool(2, step_timeout_s=3.0, reset_timeout_s=30.0, factories=FAKE) as pool:
        yield pool


def test_concurrent_reset_step_and_group_separation(fake_pool):
    pool = fake_pool
    obs = pool.reset(_tasks(4))  # episodes 0,1 share task t0 (a group of 2)
    assert [o.text for o in obs] == ["start t0", "start t0", "start t1", "start t1"]
    assert obs[0].privileged["pid"] != obs[1].privileged["pid"]  # spread over the 2 workers
    r = pool.step({0: "a", 1: "b", 2: "c", 3: "d"})
    assert [r[i].observation.text for i in range(4)] == ["t0:a:1", "t0:b:1", "t1:c:1", "t1:d:1"]
    r = pool.step({0: "a"})  # only episode 0 advances: rollouts keep separate state
    assert r[0].observation.text == "t0:a:2"
    r = pool.step({0: "a", 1: "b"})
    assert r[0].done and not r[1].done and r[1].observation.text == "t0:b:2"
    with pytest.raises(ValueError):
        pool.step({0: "again"})  # finished
    with pytest.raises(ValueError):
        pool.step({7: "x"})  # unknown
    assert set(pool.call("pid", [0, 1]).values()) == set(pool.worker_pids())
    with pytest.raises(ValueError):
        pool.call("close", [1])  # not in POOL_METHODS
    # a new reset reuses the workers and their env instances
    obs = pool.reset(_tasks(2))
    assert all(isinstance(o, Observation) for o in obs)
    assert pool.stats["failures"] == 0


def test_hang_is_cut_by_timeout(fake_pool):
    pool = fake_pool
    pool.reset(_tasks(4))
    pids = pool.worker_pids()
    t = time.monotonic()
    r = pool.step({0: "hang", 1: "ok", 2: "ok", 3: "ok"})
    assert time.monotonic() - t < 10
    assert is_failure(r[0]) and r[0].kind == "timeout" and r[0].worker == 0
    # held by the same worker: also gone. It answered meanwhile (its own lane), so it is not
    # the hung one: lost with its worker.
    assert is_failure(r[2]) and r[2].kind == "lost"
    assert isinstance(r[1], StepResult) and isinstance(r[3], StepResult)
    assert pool.stats["timeouts"] == 1 and pool.stats["worker_restarts"] == 1
    new = pool.worker_pids()
    assert new[0] != pids[0] and new[1] == pids[1]
    assert not psutil.pid_exists(pids[0]) or psutil.Process(pids[0]).status() == psutil.STATUS_ZOMBIE
    # failed episodes keep answering with their failure; the others go on
    r = pool.step({0: "x", 1: "ok"})
    assert is_failure(r[0]) and r[1].observation.text == "t0:ok:2"
    obs = pool.reset(_tasks(4))
    assert all(isinstance(o, Observation) for o in obs)


def test_crash_and_env_errors(fake_pool):
    pool = fake_pool
    pool.reset(_tasks(4))
    r = pool.step({0: "crash", 1: "raise", 2: "ok", 3: "ok"})
    assert r[0].kind == "crash" and r[2].kind in ("crash", "lost")
    assert r[1].kind == "error" and "boom" in r[1].reason
    assert isinstance(r[3], StepResult)  # same worker as the env error: still running
    assert pool.stats["crashes"] == 1 and pool.stats["env_errors"] == 1
    obs = pool.reset(_tasks(3) + _tasks(1, fail_reset=True))
    assert [is_failure(o) for o in obs] == [False, False, False, True]
    assert obs[3].kind == "error" and isinstance(obs[3], EpisodeFailure)


def test_an_unpicklable_result_is_an_env_error_with_its_cause(fake_pool):
    """The worker survives a result it cannot send, and says why (it used to die: "worker
    process died", the cause lost)."""
    pool = fake_pool
    pids = pool.worker_pids()
    pool.reset(_tasks(4))
    r = pool.step({0: "unpicklable", 1: "ok", 2: "ok", 3: "ok"})
    assert r[0].kind == "error" and "StepResult" in r[0].reason and "lock" in r[0].reason
    assert all(isinstance(r[i], StepResult) for i in (1, 2, 3))
    assert pool.worker_pids() == pids and pool.stats["crashes"] == 0 and pool.stats["env_errors"] == 1
    assert isinstance(pool.step({2: "ok"})[2], StepResult)  # the same worker goes on


def test_lost_episode_not_in_the_failing_call(fake_pool):
    pool = fake_pool
    pool.reset(_tasks(4))
    r = pool.step({0: "hang"})  # episode 2 lives in the same worker but was not stepped
    assert r[0].kind == "timeout"
    r = pool.step({2: "x", 3: "y"})
    assert r[2].kind == "lost" and isinstance(r[3], StepResult)


def _java_descendants():
    out = []
    for c in psutil.Process().children(recursive=True):
        try:
            if "java" in c.name() and c.status() != psutil.STATUS_ZOMBIE:
                out.append(c.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
def test_sciworld_pool_kill_worker_and_close():
    pytest.importorskip("scienceworld")
    from jaxscaffold.envs.sciworld import make_task

    tasks = [make_task("find-animal", 0, "train"), make_task("find-animal", 0, "train"),
             make_task("lifespan-longest-lived", 0, "train"),
             make_task("lifespan-longest-lived", 0, "train")]
    pool = EnvPool(2, env_kwargs={"sciworld": {"step_limit": 30}})
    try:
        obs = pool.reset(tasks)
        assert all(isinstance(o, Observation) for o in obs)
        gold = [o.privileged["gold_actions"] for o in obs]
        # A group shares task and variation: the same world. (Not necessarily the same gold
        # path: ScienceWorld's find-animal path once named a different animal of that world,
        # butterfly vs dove, in one of many runs; each episode follows its own path below.)
        assert obs[0].text == obs[1].text and obs[2].text == obs[3].text
        jvm = pool.call("jvm_pid", range(4))
        assert len(set(jvm.values())) == 4  # one JVM per episode
        r = pool.step({i: f"<action>{gold[i][0]}</action>" for i in range(4)})
        assert all(isinstance(x, StepResult) and not x.done for x in r.values())
        victim = pool.worker_pids()[1]  # holds episodes 1 and 3
        os.kill(victim, signal.SIGKILL)
        t = 1
        results = {0: None, 2: None}
        while any(v is None or not v.done for v in results.values()):
            acts = {i: f"<action>{gold[i][t]}</action>" for i in (0, 2)
                    if results[i] is None or not results[i].done}
            if t == 1:
                acts.update({1: f"<action>{gold[1][1]}</action>", 3: f"<action>{gold[3][1]}</action>"})
            r = pool.step(acts)
            if t == 1:
                assert r[1].kind == "crash" and r[3].kind == "crash"
            results.update({i: r[i] for i in (0, 2) if i in r})
            t += 1
        assert results[0].info["won"] and results[2].info["won"] and results[0].reward == 10.0
        assert pool.stats["crashes"] == 1 and pool.stats["failures"] == 2
        time.sleep(0.5)
        assert not _alive(jvm[1]) and not _alive(jvm[3])  # the killed worker's JVMs died too
        assert pool.worker_pids()[1] != victim
    finally:
        pool.close()
    time.sleep(0.5)
    assert not any(_alive(p) for p in jvm.values())
    assert _java_descendants() == []


def test_worker_killed_between_calls(fake_pool):
    pool = fake_pool
    pool.reset(_tasks(4))
    victim = pool.worker_pids()[0]
    os.kill(victim, signal.SIGKILL)
    for _ in range(50):  # let it die (without reaping it behind multiprocessing's back)
        if not _alive(victim):
            break
        time.sleep(0.1)
    r = pool.step({0: "a", 1: "b", 2: "c", 3: "d"})
    assert r[0].kind == "crash" and r[2].kind == "crash"
    assert r[1].observation.text == "t0:b:1" and r[3].observation.text == "t1:d:1"
    assert pool.stats["crashes"] == 1 and pool.worker_pids()[0] != victim
    assert all(isinstance(o, Observation) for o in pool.reset(_tasks(4)))
