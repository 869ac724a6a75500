"""Study statistics against independent references: the normal-theory interval of a mean,
scipy's bootstrap, and hand-computed run summaries."""

import math

import numpy as np
import pytest

from jaxscaffold.studies import stats


def test_bootstrap_interval_matches_normal_theory_for_a_large_sample():
    x = np.random.default_rng(1).normal(3.0, 2.0, 400)
    ci = stats.bootstrap_mean(x)
    half = 1.96 * x.std(ddof=1) / math.sqrt(x.size)  # the textbook 95% interval's half-width
    assert ci["mean"] == pytest.approx(x.mean())
    assert ci["low"] == pytest.approx(x.mean() - half, abs=0.03) and ci["high"] == pytest.approx(x.mean() + half, abs=0.03)


def test_bootstrap_interval_matches_scipy_percentile_bootstrap():
    scipy_stats = pytest.importorskip("scipy.stats")
    x = np.array([0.31, 0.42, 0.18, 0.55, 0.47, 0.29, 0.38])
    ours = stats.bootstrap_mean(x, resamples=20_000)
    ref = scipy_stats.bootstrap((x,), np.mean, method="percentile", n_resamples=20_000, random_state=3)
    assert ours["low"] == pytest.approx(ref.confidence_interval.low, abs=0.01)
    assert ours["high"] == pytest.approx(ref.confidence_interval.high, abs=0.01)


def test_degenerate_samples():
    assert stats.bootstrap_mean([0.5]) == {"mean": 0.5, "low": 0.5, "high": 0.5, "n": 1}
    empty = stats.bootstrap_mean([None, float("nan")])
    assert empty["n"] == 0 and math.isnan(empty["mean"])


def test_paired_difference_uses_shared_seeds_only():
    arm = {0: 0.6, 1: 0.7, 2: 0.65, 3: 0.9}
    base = {0: 0.5, 1: 0.5, 2: 0.55, 9: 0.0}
    d = stats.paired_difference(arm, base)
    assert d["seeds"] == [0, 1, 2] and d["mean"] == pytest.approx((0.1 + 0.2 + 0.1) / 3)
    assert d["excludes_zero"]  # every paired difference is positive
    noisy = stats.paired_difference({0: 0.6, 1: 0.4, 2: 0.5}, {0: 0.5, 1: 0.5, 2: 0.5})
    assert not noisy["excludes_zero"]


def test_run_summary_by_hand():
    history = [{"step": 1, "rollout/reward": 0.0, "rollout/informative_groups": 0.0, "train/entropy": 2.0},
               {"step": 2, "rollout/reward": 0.5, "rollout/informative_groups": 0.25, "train/entropy": 1.8,
                "eval/score": 0.2},
               {"step": 3, "rollout/reward": 0.25, "rollout/informative_groups": 0.5, "train/entropy": 1.5},
               {"step": 4, "rollout/reward": 0.75, "rollout/informative_groups": 0.25, "eval/score": 0.1}]
    s = stats.summarise_run(history, score="eval/score")
    assert (s["peak"], s["final"], s["first_informative_step"]) == (0.2, 0.1, 2)
    assert s["informative_share"] == pytest.approx(0.25)
    assert s["reward_variability"] == pytest.approx((0.5 + 0.25 + 0.5) / 3)
    assert s["entropy"] == {"steps": [1, 2, 3], "values": [2.0, 1.8, 1.5]}


def test_the_report_is_strict_json():
    """An undefined statistic (no informative group: no first informative step) is null."""
    import json

    from jaxscaffold.studies.report import json_safe
    summary = {"arms": {"a": {"first_informative_step": stats.bootstrap_mean([]), "peak": (0.5, float("nan"))}}}
    text = json.dumps(json_safe(summary), allow_nan=False)

    def refuse(name):
        raise ValueError(name)
    back = json.loads(text, parse_constant=refuse)
    assert back["arms"]["a"]["first_informative_step"] == {"mean": None, "low": None, "high": None, "n": 0}
    assert back["arms"]["a"]["peak"] == [0.5, None]
