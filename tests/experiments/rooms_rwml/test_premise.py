"""experiments/rooms_rwml/premise.py's measurement: mixed groups and their exact interval, on toy
reward arrays whose answers are known by hand, and against scipy's own exact binomial test."""

from __future__ import annotations

import numpy as np
import pytest


def _script():
    from experiments.rooms_rwml import premise

    return premise


def test_group_statistics_counts_only_groups_with_both_rewards():
    rewards = [[0, 0, 0, 0],  # all wrong: no advantage
               [1, 1, 1, 1],  # all right: no advantage
               [1, 0, 0, 0],  # mixed
               [0, 1, 1, 0],  # mixed
               [0, 0, 0, 0]]
    s = _script().group_statistics(rewards)
    assert (s["groups"], s["group_size"], s["mixed_groups"]) == (5, 4, 2)
    assert s["p_exact"] == pytest.approx(7 / 20) and s["mixed_share"] == pytest.approx(0.4)
    lo, hi = s["mixed_share_ci95"]
    assert lo < 0.4 < hi


def test_clopper_pearson_matches_the_closed_forms_and_scipy():
    from scipy.stats import binomtest

    cp = _script().clopper_pearson
    # k = 0 and k = n have closed forms: (0, 1 - (a/2)^(1/n)) and ((a/2)^(1/n), 1).
    assert cp(0, 10) == (0.0, pytest.approx(1 - 0.025 ** (1 / 10)))
    assert cp(10, 10) == (pytest.approx(0.025 ** (1 / 10)), 1.0)
    for k, n in ((3, 64), (19, 64), (32, 64)):
        ref = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
        assert cp(k, n) == (pytest.approx(ref.low), pytest.approx(ref.high))


def test_mixed_share_of_simulated_groups_is_its_binomial_expectation():
    # Independent answers exact with probability p: a group of G is mixed with 1 - p^G - (1-p)^G.
    rng, p, g = np.random.default_rng(0), 0.3, 4
    s = _script().group_statistics(rng.random((20_000, g)) < p)
    assert s["mixed_share"] == pytest.approx(1 - p ** g - (1 - p) ** g, abs=0.015)
    assert s["p_exact"] == pytest.approx(p, abs=0.01)


@pytest.mark.parametrize("bad", [[[0, 1, 2, 0]], [[1]], [0, 1, 0, 1], np.zeros((0, 4))])
def test_bad_rewards_are_refused_in_one_line(bad):
    with pytest.raises(ValueError, match="0/1 rewards"):
        _script().group_statistics(bad)


def test_expected_mixed_share_is_the_mean_of_each_prompts_binomial_chance():
    f = _script().expected_mixed_share
    assert f([0.0, 1.0], 4) == 0.0  # never or always exact: never mixed
    assert f([0.5], 4) == pytest.approx(1 - 2 / 16)
    assert f([0.5, 0.0], 4) == pytest.approx((1 - 2 / 16) / 2)
