"""The scores an evaluation reports: per env, per category and the paper's five-item average."""

import pytest

from jaxscaffold.train.evaluation import score_metrics


def _episodes(env, category, won, lost, failed=0):
    return ([{"env": env, "category": category, "won": True, "failed": False}] * won
            + [{"env": env, "category": category, "won": False, "failed": False}] * lost
            + [{"env": env, "category": category, "won": False, "failed": True}] * failed)


def test_score_is_the_five_item_average_of_bfcl_categories_and_sciworld():
    summaries = (_episodes("sciworld", "boil", 1, 1) + _episodes("sciworld", "melt", 0, 2, failed=1)
                 + _episodes("bfcl", "base", 1, 1) + _episodes("bfcl", "miss_func", 0, 1)
                 + _episodes("bfcl", "miss_param", 1, 0) + _episodes("bfcl", "long_context", 2, 0, failed=2))
    m = score_metrics(summaries)
    # By hand: sciworld 1/4 (the failed episode does not count), bfcl base 1/2, miss_func 0,
    # miss_param 1, long_context 1; the five items' mean (0.25 + 0.5 + 0 + 1 + 1) / 5 = 0.55,
    # where pooling every episode would give 5/10.
    assert m["eval/score"] == pytest.approx(0.55)
    assert m["eval/success_sciworld"] == pytest.approx(0.25)
    assert m["eval/success_sciworld/boil"] == pytest.approx(0.5) and m["eval/success_sciworld/melt"] == 0.0
    assert m["eval/success_bfcl"] == pytest.approx(4 / 6)
    assert {k: m[f"eval/success_bfcl/{k}"] for k in ("base", "miss_func", "miss_param", "long_context")} == {
        "base": 0.5, "miss_func": 0.0, "miss_param": 1.0, "long_context": 1.0}


def test_score_without_bfcl_averages_envs_and_ignores_missing_categories():
    summaries = _episodes("letters", "", 3, 1) + _episodes("sciworld", "boil", 0, 2)
    m = score_metrics(summaries, "eval")
    assert m["eval/score"] == pytest.approx((0.75 + 0.0) / 2)
    assert not any(k.startswith("eval/success_letters/") for k in m)  # no category: no per-category key
    only_bfcl = score_metrics(_episodes("bfcl", "base", 1, 0) + _episodes("bfcl", "miss_param", 0, 3))
    assert only_bfcl["eval/score"] == pytest.approx(0.5)  # the category mean, not 1/4 pooled
    assert score_metrics(_episodes("bfcl", "base", 0, 0, failed=2)) == {}


def test_tags_get_a_success_each_outside_the_score():
    def tagged(category, tag, won, lost):
        return [dict(e, tags=[tag]) for e in _episodes("bfcl", category, won, lost)]
    summaries = (tagged("base", "tier_easy", 2, 0) + tagged("base", "tier_hard", 0, 2)
                 + tagged("miss_param", "tier_easy", 1, 1) + tagged("miss_param", "tier_medium", 0, 1)
                 + [dict(e, tags=["tier_hard"]) for e in _episodes("bfcl", "base", 1, 0, failed=3)])
    m = score_metrics(summaries)
    # By hand: easy 3/4, medium 0/1, hard 1/3 (failed episodes excluded); base 3/5, miss_param 1/3.
    assert m["eval/success_bfcl/tier_easy"] == pytest.approx(0.75)
    assert m["eval/success_bfcl/tier_medium"] == 0.0
    assert m["eval/success_bfcl/tier_hard"] == pytest.approx(1 / 3)
    # The score stays the mean of the categories: the tags are no items of it.
    assert m["eval/score"] == pytest.approx((3 / 5 + 1 / 3) / 2)
    untagged = [{k: v for k, v in e.items() if k != "tags"} for e in summaries]
    assert {k: v for k, v in m.items() if "/tier_" not in k} == score_metrics(untagged)


def test_training_evaluation_reports_bfcl_tiers_from_episode_summaries():
    """The path training's evaluation takes (`episode_summaries` -> `score_metrics`): BFCL tasks
    bring their difficulty tier, counted by hand here."""
    pytest.importorskip("bfcl_eval")
    from jaxscaffold.envs import bfcl
    from jaxscaffold.episodes.episode import Episode
    from jaxscaffold.rollout.conversation import Conversation
    from jaxscaffold.train.metrics import episode_summaries
    tasks = bfcl.catalogue("validation")[:12]
    episodes = [Episode(task=t, group=i, conversation=Conversation(), won=i % 3 == 0, done=True)
                for i, t in enumerate(tasks)]
    m = score_metrics(episode_summaries(episodes))
    for tier in bfcl.TIERS:
        won = [e.won for e in episodes if e.task.spec["tier"] == tier]
        if won:
            assert m[f"eval/success_bfcl/tier_{tier}"] == pytest.approx(sum(won) / len(won))
        else:
            assert f"eval/success_bfcl/tier_{tier}" not in m
    assert m["eval/score"] == pytest.approx(4 / 12)  # one category (base) only: 4 won of 12


def _split(episodes, split):
    return [dict(e, split=split) for e in episodes]


def test_an_env_on_two_splits_is_also_reported_per_split():
    """ALFWorld's in- (valid_seen) and out-of-distribution (valid_unseen) sets in one
    evaluation: each split's own success beside the pooled env and its categories."""
    summaries = (_split(_episodes("alfworld", "pick_and_place_simple", 3, 1), "valid_seen")
                 + _split(_episodes("alfworld", "pick_and_place_simple", 0, 2, failed=1), "valid_unseen")
                 + _split(_episodes("alfworld", "look_at_obj_in_light", 1, 1), "valid_unseen"))
    m = score_metrics(summaries)
    # By hand: valid_seen 3/4; valid_unseen 1/4 (the failed episode does not count); pooled 4/8.
    assert m["eval/success_alfworld/valid_seen"] == pytest.approx(0.75)
    assert m["eval/success_alfworld/valid_unseen"] == pytest.approx(0.25)
    assert m["eval/success_alfworld"] == pytest.approx(0.5) and m["eval/score"] == pytest.approx(0.5)
    assert m["eval/success_alfworld/pick_and_place_simple"] == pytest.approx(0.5)
    one = score_metrics(_split(_episodes("alfworld", "pick_and_place_simple", 1, 1), "valid_seen"))
    assert "eval/success_alfworld/valid_seen" not in one  # one split: the env's success says it


def test_training_rollouts_report_tau2_per_domain():
    from jaxscaffold.train.metrics import summary_metrics
    rows = [dict(e, group=0, reward=float(e["won"]), steps=3, truncated=False, response_tokens=5, feedback=[],
                 split="train")
            for e in _episodes("tau2", "retail", 2, 2) + _episodes("tau2", "airline", 0, 1)
            + _episodes("tau2", "telecom", 1, 0, failed=1)]
    m = summary_metrics(rows, "rollout")
    assert {k: m[f"rollout/success_tau2/{k}"] for k in ("retail", "airline", "telecom")} == {
        "retail": 0.5, "airline": 0.0, "telecom": 1.0}
    assert m["rollout/success_tau2"] == pytest.approx(3 / 6) and m["rollout/infra_failures"] == 1.0
