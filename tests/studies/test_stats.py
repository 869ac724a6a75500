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


# ---------------------------------------------------------------- exact tests, Holm, intervals


def _brute_force_sign_flip(d):
    """All 2^n sign patterns by itertools, the definition written out."""
    import itertools
    observed = abs(sum(d))
    sums = [abs(sum(s * x for s, x in zip(signs, d))) for signs in itertools.product((1, -1), repeat=len(d))]
    return sum(v >= observed - 1e-12 for v in sums) / len(sums)


def test_sign_flip_by_hand():
    # FEE - standard at step 20 of the fifth rooms run, in successes of 64: only the 2 patterns
    # with all non-zero signs alike (x2 for the zero's sign) reach |sum| = 9: 4 / 32.
    assert stats.sign_flip_p([0, 2, 2, 4, 1]) == 0.125
    assert stats.sign_flip_p([1, 2, 3, 4, 5]) == 2 / 32  # the smallest p at n = 5
    assert stats.sign_flip_p([0.0, 0.0, 0.0]) == 1.0
    assert stats.sign_flip_p([1.0, -1.0]) == 1.0
    assert math.isnan(stats.sign_flip_p([])) and stats.sign_flip_p([None, 3.0]) == 1.0


@pytest.mark.parametrize("seed", range(6))
def test_sign_flip_matches_brute_force_and_scipy(seed):
    rng = np.random.default_rng(seed)
    d = list(rng.integers(-4, 6, size=int(rng.integers(3, 11))) / 64)
    assert stats.sign_flip_p(d) == pytest.approx(_brute_force_sign_flip(d), abs=1e-12)
    scipy_stats = pytest.importorskip("scipy.stats")
    ref = scipy_stats.permutation_test((np.asarray(d),), np.sum, permutation_type="samples", n_resamples=np.inf,
                                       alternative="two-sided")
    # scipy's two-sided p is twice the smaller tail; equal to |sum| >= |observed| for this symmetric null
    assert stats.sign_flip_p(d) == pytest.approx(min(ref.pvalue, 1.0), abs=1e-9)


def test_sign_flip_monte_carlo_beyond_16_matches_the_exact_distribution():
    """n = 20 integer differences: the exact p from the distribution of a sum of +-d_i
    (a convolution over integers), against the seeded Monte-Carlo estimate."""
    d = [3, -1, 2, 4, 0, 1, 2, -2, 5, 1, 3, 1, -1, 2, 0, 4, 1, 2, -3, 1]
    counts = {0: 1}
    for x in d:
        nxt = {}
        for s, c in counts.items():
            for v in (s + x, s - x):
                nxt[v] = nxt.get(v, 0) + c
        counts = nxt
    exact = sum(c for s, c in counts.items() if abs(s) >= abs(sum(d))) / 2 ** len(d)
    got = stats.sign_flip_p(d)
    assert got == pytest.approx(exact, abs=0.004) and got == stats.sign_flip_p(d)  # seeded: repeatable


def test_holm_by_hand_and_by_definition():
    # sorted 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1, held at 0.06)
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, 0.9]) == [1.0, 1.0] and stats.holm([]) == []
    got = stats.holm([0.2, None, 0.01])
    assert got[0] == pytest.approx(0.2) and math.isnan(got[1]) and got[2] == pytest.approx(0.02)
    rng = np.random.default_rng(0)
    for _ in range(20):  # Holm's rejections at alpha = the step-down procedure, run directly
        p = rng.uniform(0, 0.2, size=int(rng.integers(1, 8)))
        alpha = 0.05
        rejected, order = set(), np.argsort(p)
        for k, i in enumerate(order):
            if p[i] > alpha / (len(p) - k):
                break
            rejected.add(int(i))
        assert {i for i, q in enumerate(stats.holm(p)) if q <= alpha} == rejected


def test_t_quantile_and_interval_match_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 4, 9, 30, 200):
        for prob in (0.9, 0.975, 0.995):
            assert stats.t_quantile(prob, df) == pytest.approx(scipy_stats.t.ppf(prob, df), rel=1e-6)
    x = [0.0, 0.031, 0.031, 0.062, 0.016]
    ours = stats.mean_interval(x)
    ref = scipy_stats.ttest_1samp(x, 0.0).confidence_interval(0.95)
    assert (ours["low"], ours["high"]) == pytest.approx((ref.low, ref.high), rel=1e-6)
    assert stats.mean_interval([0.5]) == {"mean": 0.5, "low": 0.5, "high": 0.5, "n": 1}


def test_paired_contrast_over_shared_seeds():
    a = {0: 3 / 64, 1: 5 / 64, 2: 4 / 64, 3: None, 7: 1.0}
    b = {0: 1 / 64, 1: 3 / 64, 2: 0.0, 3: 0.0}
    c = stats.paired(a, b)
    assert c["seeds"] == [0, 1, 2] and c["diffs"] == pytest.approx([2 / 64, 2 / 64, 4 / 64])
    # 3 seeds: p >= 2/8; the t-interval (t_2 = 4.303, sd 2/sqrt(3) successes) still spans 0
    assert c["p"] == 0.25 and c["n"] == 3 and not c["excludes_zero"]
    assert c["low"] == pytest.approx((8 / 3 - 4.302653 * (2 / math.sqrt(3)) / math.sqrt(3)) / 64, rel=1e-4)


def test_under_a_simulated_null_the_t_interval_keeps_its_level():
    """2,000 studies of 5 seeds, both arms Binomial(64, p) per seed with p in 0.03-0.05 (the
    rooms studies' scale): the 95% t-interval excludes the true 0 in at most 6%, the exact
    sign-flip test rejects at 0.05 in at most 5% (it cannot, at n = 5), while the percentile
    bootstrap's interval excludes 0 far more often than 5%."""
    rng = np.random.default_rng(2026)
    studies, n = 2000, 5
    p = rng.uniform(0.03, 0.05, size=(studies, 1))
    diffs = (rng.binomial(64, p, (studies, n)) - rng.binomial(64, p, (studies, n))) / 64
    def excludes_zero(c):
        return c["low"] > 0 or c["high"] < 0

    t_excl = np.mean([excludes_zero(stats.mean_interval(d)) for d in diffs])
    assert t_excl <= 0.06
    assert np.mean([stats.sign_flip_p(d) <= 0.05 for d in diffs[:500]]) <= 0.05
    boot = np.mean([excludes_zero(stats.bootstrap_mean(d, resamples=1000)) for d in diffs[:500]])
    assert boot > 0.09  # the reason the study report moved off it
