"""`LocalEnvs`: the pool's contract in process, with the pool's error handling."""

import pytest

from jaxscaffold.envs.base import EpisodeFailure, Observation, StepResult, is_failure
from jaxscaffold.envs.local import LocalEnvs
from jaxscaffold.envs.pool import EnvPool
from tests.envs.test_pool import FAKE, FakeEnv, _tasks


def test_reset_step_and_finished_episodes():
    envs = LocalEnvs({"fake": FakeEnv})
    obs = envs.reset(_tasks(2))
    assert [o.text for o in obs] == ["start t0", "start t0"]
    r = envs.step({0: "a", 1: "b"})
    assert [r[i].observation.text for i in range(2)] == ["t0:a:1", "t0:b:1"]
    envs.step({0: "a"})
    assert envs.step({0: "a"})[0].done
    with pytest.raises(ValueError):
        envs.step({0: "again"})  # finished
    with pytest.raises(ValueError):
        envs.step({7: "x"})  # unknown
    envs.close()


def test_env_errors_fail_like_the_pool():
    """Same exceptions caught, same failure fields (worker aside) as `EnvPool`."""
    tasks = _tasks(3) + _tasks(1, fail_reset=True)
    tasks[2] = type(tasks[2])(env="nope", task_id="t9", split="x")
    local = LocalEnvs({"fake": FakeEnv})
    with EnvPool(1, factories=FAKE) as pool:
        got = {}
        for name, envs in (("local", local), ("pool", pool)):
            obs = envs.reset(tasks)
            step = envs.step({0: "raise", 1: "ok"})
            again = envs.step({0: "ok"})[0]
            got[name] = (obs, step, again)
    for (obs, step, again) in got.values():
        assert [is_failure(o) for o in obs] == [False, False, True, True]
        assert is_failure(step[0]) and isinstance(step[1], StepResult) and again == step[0]
    fields = lambda f: (f.reason, f.kind, f.episode, f.task)  # noqa: E731
    (lo, ls, _), (po, ps, _) = got["local"], got["pool"]
    assert fields(lo[2]) == fields(po[2]) and "no env factory registered for 'nope'" in lo[2].reason
    assert fields(lo[3]) == fields(po[3]) == ("EnvError: reset failed on purpose", "error", 3, tasks[3])
    assert fields(ls[0]) == fields(ps[0]) == ("EnvError: boom", "error", 0, tasks[0])
    assert isinstance(lo[0], Observation) and isinstance(lo[3], EpisodeFailure) and lo[3].worker is None
    local.close()
