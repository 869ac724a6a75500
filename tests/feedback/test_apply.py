"""`Feedback`: the schedule, the group's coin and the enricher, as one decision per observation."""

from jaxscaffold.envs.base import Observation
from jaxscaffold.feedback import randomization, schedule
from jaxscaffold.feedback.apply import NONE, Feedback


def _enrichers():
    def enrich(kind, obs, step, actions):
        return obs.text if kind == "oe" and step == 0 else f"{obs.text} [{kind}:{len(actions)}]"
    return {"coin": enrich}


def test_standard_env_and_envs_without_enrichers_are_unchanged():
    obs = Observation("hello", {"x": 1})
    assert NONE.show(obs, env="coin", group=0, rollout=0, episode_step=0, actions=[]).text == "hello"
    fb = Feedback(schedule.make("ag_early", p=1.0), _enrichers(), train_step=1, num_groups=2)
    shown = fb.show(obs, env="letters", group=0, rollout=0, episode_step=0, actions=[])
    assert shown.text == "hello" and shown.applied == ()


def test_decisions_follow_randomization_and_count_only_real_changes():
    sched = schedule.Schedule("both", (schedule.Window("ag", (0, 5), probability=0.5),
                                       schedule.Window("oe", (0, 5), probability=0.5)))
    obs = Observation("o")
    for mode in ("group", "rollout", "first_half", "even"):
        fb = Feedback(sched, _enrichers(), mode=mode, run_seed=7, train_step=3, num_groups=4)
        for group in range(4):
            for rollout in range(2):
                for step in (0, 1):
                    shown = fb.show(obs, env="coin", group=group, rollout=rollout, episode_step=step, actions=["a"])
                    want = [k for k in ("ag", "oe") if randomization.decide(
                        mode, 0.5, run_seed=7, train_step=3, group_id=group, num_groups=4, rollout=rollout, kind=k)]
                    applied = [k for k in want if not (k == "oe" and step == 0)]  # oe changes nothing at step 0
                    assert shown.applied == tuple(applied)
                    assert shown.text == "o" + "".join(f" [{k}:1]" for k in applied)
