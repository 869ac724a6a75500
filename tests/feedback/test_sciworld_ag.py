"""ScienceWorld AG never names an action invalid at the moment it is given.

Fast tests run the guide on hand-written simulator views (the reference: membership in the
view's valid actions); slow ones on real episodes, where each hint is checked by a second,
independent simulator that replays the episode's actions and then tries the hint."""

from __future__ import annotations

import dataclasses
import random

import pytest

from jaxscaffold.envs.base import Observation
from jaxscaffold.feedback import enrichers as E
from jaxscaffold.feedback.sciworld_ag import Entry, GoldGuide, SimView, containers, resolve

TEMPLATES = {0: "open obj", 1: "close obj", 2: "go obj", 4: "look at obj", 13: "use obj on obj",
             21: "pick up obj", 22: "put down obj", 3: "look around"}
REFERENTS = {1: ("thermometer",), 2: ("substance in metal pot", "water"), 3: ("kitchen",),
             4: ("bathroom",), 5: ("door to kitchen", "kitchen door"), 6: ("hallway",),
             7: ("door",)}


def view(*entries: tuple[str, int, tuple[int, ...]], observation: str = "") -> SimView:
    return SimView(tuple(Entry(a, t, ids) for a, t, ids in entries), TEMPLATES, REFERENTS, observation)


def test_resolve_reads_the_gold_spellings_as_listed_actions():
    v = view(("look at water", 4, (2,)), ("use thermometer on water", 13, (1, 2)),
             ("go to kitchen", 2, (3,)), ("close kitchen door", 1, (5,)), ("look around", 3, ()))
    assert resolve("examine substance in metal pot", v) == "look at water"  # alias + another name
    assert resolve("use thermometer in inventory on substance in metal pot", v) == "use thermometer on water"
    assert resolve("go to kitchen", v) == "go to kitchen"
    assert resolve("close door to kitchen", v) == "close kitchen door"  # doors have several names
    assert resolve("Look  Around", v) == "look around"
    assert resolve("go to bathroom", v) is None  # not listed
    assert resolve("pick up thermometer", v) is None
    assert resolve("use water on thermometer", v) is None  # the slots keep their order
    only_door = view(("open door", 0, (7,)))
    assert resolve("open door to hallway", only_door) == "open door"  # a room's only door


def test_container_qualifiers_pick_the_object_inside_and_hints_name_it_unambiguously():
    """Two apple seeds, one per flower pot: 'apple seed in flower pot 2' is the one in pot 2,
    and the hint re-spells the listing's shared 'apple seed in flower pot' (the simulator would
    ask which one; focusing on the wrong one fails the task)."""
    templates = {**TEMPLATES, 11: "focus on obj"}
    referents = {10: ("apple seed",), 11: ("apple seed",), 20: ("flower pot", "flower pot 1"),
                 21: ("flower pot", "flower pot 2")}
    v = SimView((Entry("focus on apple seed in flower pot", 11, (10,)),
                 Entry("focus on apple seed in flower pot", 11, (11,))),
                templates, referents, parent={10: 20, 11: 21, 20: 99, 21: 99})
    assert resolve("focus on apple seed in flower pot 2", v) == "focus on apple seed in flower pot 2"
    assert resolve("focus on apple seed in flower pot 1", v) == "focus on apple seed in flower pot 1"
    # an unknown container constrains nothing: one of the seeds, named unambiguously
    assert resolve("focus on apple seed in flower pot 3", v) in {
        "focus on apple seed in flower pot 1", "focus on apple seed in flower pot 2"}
    assert containers({"uuid": "1", "contents": {"a-2": {"uuid": "2", "contents": {"b-3": {"uuid": "3"}}}}}) == {
        2: 1, 3: 2}


GOLD = ["open door to kitchen", "go to kitchen", "look around", "pick up thermometer", "put down thermometer"]


def test_guide_follows_the_gold_path_restores_after_a_move_and_skips_what_holds():
    g = GoldGuide(GOLD, "This room is called the hallway. In it ...")
    hall_closed = view(("open door to kitchen", 0, (5,)), ("look around", 3, ()))
    assert g.hint(hall_closed) == ("open door to kitchen", "gold", 0)
    g.observe("open door to kitchen", "The door is now open.")
    hall_open = view(("close door to kitchen", 1, (5,)), ("go to kitchen", 2, (3,)), ("look around", 3, ()))
    assert g.hint(hall_open).action == "go to kitchen"
    g.observe("go to kitchen", "You move to the kitchen.")
    kitchen = view(("look around", 3, ()), ("pick up thermometer", 21, (1,)), ("go to bathroom", 2, (4,)),
                   ("go to hallway", 2, (6,)))
    assert g.hint(kitchen).action == "look around"
    g.observe("look around", "This room is called the kitchen.")
    assert g.hint(kitchen) == ("pick up thermometer", "gold", 3)
    # the issue's case: three gold steps, then off to the bathroom
    g.observe("go to bathroom", "You move to the bathroom.")
    bathroom = view(("go to kitchen", 2, (3,)), ("look around", 3, ()))
    assert g.hint(bathroom) == ("go to kitchen", "restore", -1)  # not 'pick up thermometer'
    g.observe("go to kitchen", "You move to the kitchen.")
    assert g.restore == [] and g.hint(kitchen).action == "pick up thermometer"
    g.observe("pick up thermometer", "You move the thermometer to the inventory.")
    assert g.hint(view(("look around", 3, ()))).action is None  # 'put down' not listed: no hint
    assert g.hint(view(("look around", 3, ()))).source == "none:gold_step_invalid"
    # a step whose effect already holds is skipped: the door is open already
    g2 = GoldGuide(GOLD, "This room is called the hallway.")
    assert g2.hint(hall_open) == ("go to kitchen", "gold", 1)


def test_a_hint_the_simulator_refused_is_not_given_again_until_the_state_changes():
    g = GoldGuide(["pick up thermometer", "look around"], "This room is called the kitchen.")
    v = view(("pick up thermometer", 21, (1,)), ("look around", 3, ()))
    assert g.hint(v).action == "pick up thermometer"
    g.observe("pick up thermometer", "No known action matches that input.")
    assert g.hint(v) == (None, "none:gold_step_invalid", -1)  # refused: not again
    g.observe("look around", "This room is called the kitchen.")  # the world moved on
    assert g.hint(v).action == "pick up thermometer"


def test_an_ambiguity_prompt_is_answered_with_an_offered_number():
    prompt = ("Ambiguous request: Please enter the number for the action you intended (or blank to "
              "cancel):\n0:\tmove apple seed (in seed jar) to flower pot 1\n1:\tmove apple seed (in seed jar) "
              "to flower pot 1")
    g = GoldGuide(["move apple seed in seed jar to flower pot 1", "1", "look around"])
    g.observe("move apple seed in seed jar to flower pot 1", prompt)
    assert g.hint(view(("look around", 3, ()), observation=prompt)) == ("1", "choice", 1)  # the gold's answer
    g2 = GoldGuide(["pick up thermometer"])
    assert g2.hint(view(("look around", 3, ()), observation=prompt)) == ("0", "choice", -1)
    g2.observe("0", "You move the apple seed to the flower pot 1.")
    assert g2.k == 0  # answering a prompt the gold path never met does not move along it


def test_guide_hints_are_always_listed_under_random_states_and_actions():
    """A property: whatever the listing and whatever the agent does, a hint is a member of
    the listing it was computed from (or there is none)."""
    pool = [("go to kitchen", 2, (3,)), ("go to hallway", 2, (6,)), ("go to bathroom", 2, (4,)),
            ("open door to kitchen", 0, (5,)), ("close door to kitchen", 1, (5,)),
            ("pick up thermometer", 21, (1,)), ("put down thermometer", 22, (1,)),
            ("look at water", 4, (2,)), ("look around", 3, ()), ("use thermometer on water", 13, (1, 2))]
    texts = {"go": "You move to the {}.", "open": "The door is now open.", "close": "The door is now closed."}
    gold = GOLD + ["examine substance in metal pot", "use thermometer in inventory on substance in metal pot"]
    rng, hints = random.Random(0), 0
    for _ in range(200):
        g = GoldGuide(gold, "This room is called the hallway.")
        for _ in range(12):
            v = view(*rng.sample(pool, rng.randint(1, len(pool))))
            h = g.hint(v)
            if h.action is not None:
                hints += 1
                assert h.action in v.actions, (h, v.actions)
            a = rng.choice(pool)[0] if rng.random() < 0.5 or h.action is None else h.action
            verb = a.split()[0]
            g.observe(a, texts.get(verb, "ok").format(a.rsplit(" ", 1)[-1]))
    assert hints > 1000


def test_enricher_shows_the_guide_hint_and_nothing_without_one():
    obs = Observation("o", {"ag_hint": "go to kitchen", "gold_actions": ["pick up thermometer"]})
    assert E.sciworld_ag_paper(obs, []) == "o\n[Hint] A valid next action: go to kitchen"
    assert E.sciworld_ag_paper(Observation("o", {"ag_hint": None, "gold_actions": ["x"]}), []) == "o"
    assert E.env_kwargs()["sciworld"]["ag_guide"] == "jaxscaffold.feedback.sciworld_ag:GoldGuide"


# ----------------------------------------------------------------------------- real episodes


def _planned(task, windows=None):
    return dataclasses.replace(task, spec={**task.spec, "feedback": {"ag": windows}})


def _accepted(shadow, task, actions, hint) -> bool:
    """Replays `actions` on an independent simulator and tries `hint` there."""
    shadow.reset(task)
    for a in actions:
        shadow.step(f"<action>{a}</action>")
    r = shadow.step(f"<action>{hint}</action>")
    said = r.observation.privileged["observation"].lower()
    return not r.info["invalid"] and (hint.isdigit() or "ambiguous request" not in said)


@pytest.mark.slow
def test_the_issue_case_on_a_real_episode():
    """boil: 3 gold steps, then the bathroom. The fixed-path hint 'pick up thermometer' is
    rejected there; the guide's hint is accepted and leads back to the gold path."""
    from jaxscaffold.envs.sciworld import ScienceWorldEnv, make_task
    env, shadow = ScienceWorldEnv(step_limit=100, **E.env_kwargs()["sciworld"]), ScienceWorldEnv(step_limit=100)
    try:
        task = _planned(make_task("boil", 0, "train"))
        obs = env.reset(task)
        gold = obs.privileged["gold_actions"]
        actions = gold[:3] + ["open bathroom door", "go to bathroom"]
        for a in actions:
            obs = env.step(f"<action>{a}</action>").observation
        assert obs.privileged["observation"].startswith("You move to the bathroom")
        assert not _accepted(shadow, task, actions, gold[3])  # 'No known action matches'
        hint = obs.privileged["ag_hint"]
        assert obs.privileged["ag_hint_source"] == "restore" and _accepted(shadow, task, actions, hint)
        obs = env.step(f"<action>{hint}</action>").observation
        assert obs.privileged["ag_hint"] == gold[3]
        # the plan's windows: hints only on the steps asked for
        obs = env.reset(_planned(make_task("boil", 0, "train"), [(1, 1)]))
        assert obs.privileged["ag_hint"] is None and obs.privileged["ag_hint_source"] == "not_requested"
        assert env.step(f"<action>{gold[0]}</action>").observation.privileged["ag_hint"] == gold[1]
    finally:
        env.close()
        shadow.close()


@pytest.mark.slow
def test_every_hint_is_accepted_by_an_independent_simulator_under_deviation():
    """Two episodes of a gold policy deviating with p=0.4 (a random listed action): every hint,
    followed or not, is accepted by a second simulator replaying the same actions."""
    from jaxscaffold.envs.sciworld import ScienceWorldEnv, make_task
    env, shadow = ScienceWorldEnv(step_limit=100, **E.env_kwargs()["sciworld"]), ScienceWorldEnv(step_limit=100)
    rng, checked, deviations = random.Random(1), 0, 0
    try:
        for name in ("use-thermometer", "chemistry-mix-paint-secondary-color"):
            task = _planned(make_task(name, 0, "train"))
            obs, actions = env.reset(task), []
            for _ in range(7):
                hint = obs.privileged["ag_hint"]
                if hint is not None:
                    assert _accepted(shadow, task, actions, hint), (name, actions, hint)
                    checked += 1
                if hint is None or rng.random() < 0.4:
                    options = [a for a in env.valid_actions() if not a.startswith("focus on") and a != hint]
                    action, deviations = rng.choice(options), deviations + 1
                else:
                    action = hint
                r = env.step(f"<action>{action}</action>")
                actions.append(action)
                obs = r.observation
                if r.done:
                    break
        assert checked >= 10 and deviations >= 2
    finally:
        env.close()
        shadow.close()
