"""Enrichers on the real environments, after scripted partial gold paths."""

import pytest

from jaxscaffold.envs.base import Observation
from jaxscaffold.feedback import enrichers as E


def _act(a):
    return f"<think>following the plan</think><action>{a}</action>"


def test_gold_progress_and_checklist_units():
    gold = ["open door", "go to kitchen", "take cup"]
    assert E.gold_progress(gold, []) == 0
    assert E.gold_progress(gold, ["look around", "open door", "go to kitchen"]) == 2
    assert E.gold_progress(gold, ["go to kitchen", "open door"]) == 1  # order matters
    assert E.checklist([("a", True), ("b", False)]) == "[Pass] a\n[Pending] b\n[1/2 done]"
    assert E.enricher("letters") is None


@pytest.mark.slow
def test_sciworld_ag_and_oe_after_a_partial_gold_path():
    from jaxscaffold.envs.sciworld import ScienceWorldEnv, make_task
    env = ScienceWorldEnv(step_limit=100)
    try:
        obs = env.reset(make_task("boil", 0, "train"))
        gold = obs.privileged["gold_actions"]
        ref = E.sciworld_ag_reference(obs, [])
        assert E.CAUTION in ref and all(a in ref for a in obs.privileged["ag_actions"][:3])
        half = len(gold) // 2
        done_actions = []
        for a in gold[:half]:
            r = env.step(_act(a))
            done_actions.append(a)
            obs = r.observation
        text = E.sciworld_ag_paper(obs, done_actions)
        assert text.endswith(f"[Hint] A valid next action: {gold[half]}")
        # An off-path action does not advance the progress.
        assert E.sciworld_ag_paper(obs, done_actions + ["xyzzy"]).endswith(gold[half])
        checklist = E.sciworld_oe_checklist(obs, done_actions)
        goals = obs.privileged["goals"]["sequential"]
        k = sum(g["done"] for g in goals)
        assert f"[{k}/{len(goals)} done]" in checklist
        assert checklist.count("[Pass]") == k and checklist.count("[Pending]") == len(goals) - k
        assert k >= 1  # the partial gold path completed at least one sub-goal
        raw = E.sciworld_oe_reference(obs, done_actions)
        assert "[Hint]Considering The current goal progress is" in raw and "Sequential Subgoals" in raw
    finally:
        env.close()


@pytest.mark.slow
def test_alfworld_ag_and_oe_after_a_partial_walkthrough(alfworld_data):
    from jaxscaffold.envs import alfworld as A
    env = A.ALFWorldEnv(data_dir=alfworld_data.root)
    try:
        task = next(t for t in A.catalogue("valid_unseen", alfworld_data.root)
                    if t.spec["task_type"] == "pick_heat_then_place_in_recep")
        obs = env.reset(task)
        plan = obs.privileged["walkthrough"]
        actions = plan[: len(plan) // 2]
        for a in actions:
            obs = env.step(_act(a)).observation
        assert E.alfworld_ag(obs, actions).endswith(f"[Hint] A valid next action: {plan[len(actions)]}")
        text = E.alfworld_oe(obs, actions)
        goals = obs.privileged["goal_progress"]
        k = sum(g["done"] for g in goals)
        assert f"[{k}/{len(goals)} done]" in text and 0 < k < len(goals)
    finally:
        env.close()


def test_enricher_dispatch_uses_the_configured_forms():
    obs = Observation("You are in the kitchen.", {"ag_actions": ["a", "b", "c"], "gold_actions": ["a", "b"]})
    assert E.CAUTION in E.enricher("sciworld", {"ag": "reference"})("ag", obs, 0, [])
    assert E.enricher("sciworld")("ag", obs, 0, ["a"]).endswith("valid next action: b")


def test_bfcl_ag_on_real_entries():
    from jaxscaffold.envs import bfcl as B
    env = B.BFCLEnv(B.BFCLOptions(tool_format="python"))
    base = next(t for t in B.catalogue("train") if t.spec["category"] == "base")
    obs = env.reset(base)
    gold = obs.privileged["gold_calls"]
    enrich = E.enricher("bfcl")
    assert enrich("ag", obs, 0, []).endswith(f"{E.BFCL_HINT} {gold[0]}")
    assert enrich("oe", obs, 0, []) == obs.text  # BFCL OE rewrites tool outputs only: a user turn is unchanged
    r = env.step("[" + ", ".join(gold) + "]")  # a tool-result observation gets no AG
    assert r.observation.privileged["message_role"] == "tool"
    assert enrich("ag", r.observation, 1, []) == r.observation.text
    # A miss_param entry: its empty-gold turn gets the ask-the-user hint.
    for task in B.catalogue("train"):
        if task.spec["category"] != "miss_param":
            continue
        obs = env.reset(task)
        for turn in range(task.spec["num_turns"]):
            if obs.privileged["turn"] >= 3:
                break
            if not obs.privileged["gold_calls"]:
                assert enrich("ag", obs, 0, []).endswith(E.BFCL_MISS_PARAM)
                return
            obs = env.step("[" + ", ".join(obs.privileged["gold_calls"]) + "]").observation
            obs = env.step("Done.").observation
    pytest.fail("no miss_param entry with an empty-gold turn among the first 3 turns")
