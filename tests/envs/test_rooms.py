"""The rooms testbed: every gold plan wins (and only at its end), the planner is optimal (an
independent iterative-deepening search agrees), AG is always valid and always shortens the
plan, the checklist is true, the splits are disjoint and deterministic, and text is only parsed."""

from __future__ import annotations

import random

import pytest

from jaxscaffold.envs import rooms
from jaxscaffold.envs.actions import action_text
from jaxscaffold.envs.base import Task
from jaxscaffold.feedback import enrichers


def _world(**kw):
    base = dict(rooms=("red", "blue"), doors=frozenset({frozenset(("red", "blue"))}), locked=frozenset({"blue"}),
                containers=(("red", "box"), ("blue", "chest")), start="red",
                placements=(("blue key", ("red", "box")), ("gem", "red")), goal=("gem", ("blue", "chest")))
    return rooms.World(**{**base, **kw})


def test_a_hand_made_world_has_the_plan_worked_out_by_hand():
    w = _world()
    assert rooms.shortest_plan(w, rooms.initial_state(w)) == [
        "open box", "take blue key", "unlock blue door", "take gem", "go to blue", "open chest", "put gem in chest"]
    s = rooms.initial_state(w)
    assert rooms.valid_actions(w, s) == ["open box", "take gem", "look"]  # the door is locked, no key yet
    assert rooms.apply(w, s, "go to blue") is None and rooms.apply(w, s, "look") == s


def _iddfs_length(w, s, limit=12):
    """An independent optimal-length search (depth-first, iterative deepening)."""
    def reachable(state, depth, seen):
        if rooms.goal_done(w, state):
            return True
        if depth == 0:
            return False
        for a in rooms.valid_actions(w, state)[:-1]:
            nxt = rooms.apply(w, state, a)
            if nxt not in seen and reachable(nxt, depth - 1, seen | {nxt}):
                return True
        return False
    return next(d for d in range(limit + 1) if reachable(s, d, {s}))


def test_the_planner_is_optimal():
    tasks = sorted(rooms.catalogue("test"), key=lambda t: t.spec["plan_length"])
    ten = next(t for t in tasks if t.spec["plan_length"] == 10)
    for task in tasks[:3] + [ten]:  # short ones and a 10-step one (the search is exponential)
        w, plan = rooms.generate(task.seed)
        assert len(plan) == _iddfs_length(w, rooms.initial_state(w)) == task.spec["plan_length"]


def test_every_gold_plan_wins_at_its_end_only():
    for task in rooms.catalogue("test"):
        env = rooms.RoomsEnv(step_limit=30)
        obs = env.reset(task)
        plan = obs.privileged["gold_actions"]
        assert rooms.MIN_PLAN <= len(plan) <= rooms.MAX_PLAN
        for i, action in enumerate(plan):
            res = env.step(action_text(action))
            assert not res.info["invalid"]
            assert (res.reward, res.done) == ((1.0, True) if i == len(plan) - 1 else (0.0, False))
        assert all(g["done"] for g in res.observation.privileged["goals"])


def test_ag_is_always_valid_and_shortens_the_plan_after_deviations():
    rng = random.Random(0)
    for task in rooms.catalogue("test")[:16]:
        env = rooms.RoomsEnv(step_limit=40)
        obs = env.reset(task)
        for _ in range(40):
            p = obs.privileged
            hint = p["next_walkthrough_action"]
            assert hint in p["valid_actions"] and f"Hint: {hint}" in enrichers.enricher("rooms")("ag", obs, 0, [])
            follow = rng.random() < 0.6
            res = env.step(hint if follow else rng.choice(p["valid_actions"]))
            if follow:
                assert res.observation.privileged["plan_left"] == p["plan_left"] - 1
            if res.done:
                assert res.info["won"]
                break
            obs = res.observation


def test_the_checklist_is_true_along_the_gold_path():
    task = rooms.catalogue("train")[0]
    env = rooms.RoomsEnv()
    obs = env.reset(task)
    done_counts = [sum(g["done"] for g in obs.privileged["goals"])]
    for action in obs.privileged["gold_actions"]:
        obs = env.step(action).observation
        done_counts.append(sum(g["done"] for g in obs.privileged["goals"]))
        w, s = env.world, env.state
        for g in obs.privileged["goals"]:
            if g["description"].startswith("unlock the "):
                assert g["done"] == (g["description"].split()[2] in s.unlocked)
    assert done_counts == sorted(done_counts) and done_counts[-1] == len(obs.privileged["goals"])
    assert done_counts[0] == 0


def test_splits_are_deterministic_and_their_layouts_disjoint():
    train, test = rooms.catalogue("train"), rooms.catalogue("test")
    assert (len(train), len(test)) == (512, 64)
    keys = {rooms.layout_key(rooms.generate(t.seed)[0]) for t in train}
    assert not keys & {rooms.layout_key(rooms.generate(t.seed)[0]) for t in test}
    assert len(keys) == 512
    assert [t.spec for t in rooms.catalogue("test")] == [t.spec for t in test]
    with pytest.raises(ValueError, match="no split 'valid'"):
        rooms.catalogue("valid")


@pytest.mark.parametrize("text", ["rm -rf /", "<action>take moon</action>", "__import__('os')", "", "go to purple"])
def test_bad_actions_change_nothing(text):
    env = rooms.RoomsEnv()
    env.reset(Task("rooms", "x", "test", spec={"seed": rooms.catalogue("test")[0].seed}))
    before = env.state
    res = env.step(text)
    assert res.info["invalid"] and res.observation.text.startswith("Nothing happens.") and env.state == before


def test_actions_are_read_from_tags_or_text():
    assert rooms.read_action("<think>hmm</think><action>Go to the Red room.</action>") == "go to red"
    assert rooms.read_action("I think.\n</think>\n\nopen the box\nmore") == "open box"
