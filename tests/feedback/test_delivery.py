"""Feedback delivered per benchmark as the reference code does: windows counted in each env's
own unit (ScienceWorld: actions taken; BFCL: user turns for AG, every tool result for OE), the
episode's plan handed to the env at reset, and BFCL's response check comparing enriched with
enriched outputs when OE is on."""

from __future__ import annotations

import pytest

from jaxscaffold.envs.base import Observation, Task
from jaxscaffold.feedback import schedule, units
from jaxscaffold.feedback import enrichers as E
from jaxscaffold.feedback.apply import NONE, Feedback


def test_units_per_env_and_kind():
    assert units.unit("sciworld", "ag") == units.unit("sciworld", "oe") == "action"
    assert units.unit("bfcl", "ag") == "user_turn" and units.unit("bfcl", "oe") == "every"
    obs = Observation("q", {"turn": 2})
    assert units.position("bfcl", "ag", obs, 7) == 2
    assert units.position("bfcl", "oe", obs, 7) is None
    assert units.position("sciworld", "ag", obs, 7) == 7


def test_positions_override_episode_steps_and_none_covers_every_step():
    s = schedule.make("ag_early_oe_late")
    # without positions: the episode-step table (unchanged behaviour)
    assert s.active_kinds(50, 4) == () and s.active_kinds(50, 2) == ("ag",)
    # a user-turn position of 2 at episode step 4 is inside AG's (0, 2)
    assert s.active_kinds(50, 4, {"ag": 2}) == ("ag",)
    assert s.active_kinds(50, 0, {"ag": 3}) == ()
    # None: every position, but only within the window's training steps
    assert s.active_kinds(150, 0, {"oe": None}) == ("oe",)
    assert s.active_kinds(50, 7, {"oe": None}) == ()


def _fb(name: str, p: float = 1.0, mode: str = "group", train_step: int = 1, envs=("bfcl", "sciworld")) -> Feedback:
    return Feedback(schedule.make(name, p=p), {e: E.enricher(e) for e in envs}, mode=mode,
                    run_seed=3, train_step=train_step, num_groups=4)


def test_prepare_writes_the_episode_plan_into_the_task():
    task = Task("bfcl", "multi_turn_base_0", "train", spec={"category": "base", "index": 0})
    oe = _fb("oe_late").prepare(task, group=0, rollout=0)
    assert oe.spec["feedback"] == {"oe": None} and oe.spec["category"] == "base"
    assert task.spec == {"category": "base", "index": 0}  # the original is left alone
    sw = Task("sciworld", "boil/0", "train", spec={"task_name": "boil", "variation": 0})
    assert _fb("ag_early").prepare(sw, group=0, rollout=0).spec["feedback"] == {"ag": [(0, 2)]}
    assert _fb("ag_early_oe_late", train_step=150).prepare(sw, group=1, rollout=0).spec["feedback"] == {
        "oe": [(5, 9)]}
    # no plan: the same task object (the standard env, a group whose coin is off, no enricher)
    assert NONE.prepare(task, group=0, rollout=0) is task
    assert _fb("ag_early", p=0.0).prepare(task, group=0, rollout=0) is task
    assert _fb("ag_early", envs=("sciworld",)).prepare(task, group=0, rollout=0) is task
    # the plan follows the same coin as `show`: first half of the groups only
    half = _fb("oe_early", mode="first_half")
    assert [("feedback" in half.prepare(task, group=g, rollout=0).spec) for g in range(4)] == [
        True, True, False, False]


def _bfcl():
    pytest.importorskip("bfcl_eval")
    from jaxscaffold.envs import bfcl

    return bfcl


def _bfcl_env(**kwargs):
    return _bfcl().BFCLEnv.from_kwargs(**{**E.env_kwargs()["bfcl"], "tool_format": "python", **kwargs})


def _bfcl_task(task_id: str) -> Task:
    B = _bfcl()
    return next(t for t in B.catalogue("train") + B.catalogue("validation") if t.task_id == task_id)


def _gold_run(feedback: Feedback, task: Task):
    """Runs the gold answers through the driver (LocalEnvs, GoldAgent) with `feedback`."""
    from jaxscaffold.envs.local import LocalEnvs
    from jaxscaffold.episodes.agents import GoldAgent
    from jaxscaffold.episodes.driver import run_episodes

    envs = LocalEnvs({"bfcl": lambda: _bfcl_env()})
    try:
        return run_episodes(GoldAgent(), envs, [task], [0], max_turns=60, feedback=feedback)[0]
    finally:
        envs.close()


def test_bfcl_ag_reaches_user_turns_0_to_2_whatever_the_episode_step():
    """Gold play: turn t's user message comes at episode step 2t (one tool step and one reply
    per turn), so the episode-step window (0, 2) covered turns 0-1 only."""
    task = next(t for t in _bfcl().catalogue("train") if t.spec["category"] == "base" and t.spec["num_turns"] >= 4)
    ep = _gold_run(_fb("ag_early"), task)
    ag_steps = [s for s, k in ep.feedback if k == "ag"]
    assert ag_steps == [0, 2, 4]  # user turns 0, 1, 2; turn 3 (step 6) gets none
    assert ep.won


def test_bfcl_oe_enriches_every_tool_result_and_the_check_compares_enriched():
    """`oe_late` (episode steps 5-9 on ScienceWorld): on BFCL every tool result of the episode
    is enriched, and the gold play still wins under the enriched response check."""
    task = _bfcl_task("multi_turn_base_0")
    ep = _gold_run(_fb("oe_late"), task)
    oe_steps = {s for s, k in ep.feedback if k == "oe"}
    assert min(oe_steps) < 5 and ep.won
    env = _bfcl_env()
    obs = env.reset(task)
    tool_steps, step = set(), 0
    for calls in obs.privileged["gold_calls_all"]:
        for action in (["[" + ", ".join(calls) + "]"] if calls else []) + ["Done."]:
            r = env.step(action)
            step += 1
            p = r.observation.privileged
            if not r.done and p["message_role"] == "tool" and p["oe_text"] != r.observation.text:
                tool_steps.add(step)
    assert oe_steps == tool_steps  # every enriched tool result, none else


def test_bfcl_response_check_compares_enriched_when_oe_is_planned():
    """The reordered-but-equivalent calls of multi_turn_base_39 pass the plain check and fail
    the enriched one (listings taken mid-way differ): planned OE switches the check."""
    task = _bfcl_task("multi_turn_base_39")
    gold = _bfcl().load_entry("base", 39)[1]
    turn = gold[1]
    reordered = [turn[0], turn[1], turn[3], turn[5], turn[2], turn[4], turn[6]]

    def verdict(t: Task, **kwargs) -> dict:
        env = _bfcl_env(**kwargs)
        env.reset(t)
        for i, calls in enumerate(gold):
            env.step("[" + ", ".join(reordered if i == 1 else calls) + "]")
            r = env.step("done")
            if i == 1:
                return r.info["turn_check"]

    planned = _fb("oe_early").prepare(task, group=0, rollout=0)
    assert verdict(task)["valid"]
    assert verdict(planned)["error_type"] == "multi_turn:execution_response_mismatch"
    assert verdict(planned, response_check_with_oe=None)["valid"]  # the option: always plain
    with pytest.raises(ValueError):
        _bfcl_env(response_check_with_oe="enriched")


def test_bfcl_ag_skips_miss_func_reveal_turns():
    """The reference appends the hint to a turn's first user message; a revealing turn has
    none, so it gets no hint (even with gold calls)."""
    env = _bfcl_env()
    enrich = E.enricher("bfcl")
    for task in _bfcl().catalogue("train"):
        if task.spec["category"] != "miss_func":
            continue
        obs = env.reset(task)
        while True:
            p = obs.privileged
            if p["turn"] >= 3:
                break
            if p["revealed_functions"]:
                assert p["gold_calls"]  # the reveal turn has gold calls ...
                assert enrich("ag", obs, 0, []) == obs.text  # ... and no hint
                return
            calls = p["gold_calls"]
            if calls:
                env.step("[" + ", ".join(calls) + "]")
            r = env.step("Done.")
            if r.done:
                break
            obs = r.observation
    pytest.fail("no miss_func entry reveals within its first 3 turns")
