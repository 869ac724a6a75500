"""The difficulty filter keeps every hard triple and p_keep_easy of the easy ones."""

import numpy as np

from jaxscaffold.worldmodel import difficulty


def test_kept_fraction_on_a_synthetic_set():
    rng = np.random.default_rng(0)
    n_easy, n_hard, k = 7000, 3000, 10
    # K=10 binary rewards per triple: easy triples succeed 95% of the time, hard ones 30%.
    rewards = np.concatenate([rng.random((n_easy, k)) < 0.95, rng.random((n_hard, k)) < 0.3])
    truly_easy = np.arange(n_easy + n_hard) < n_easy
    keep, easy = difficulty.keep_mask(rewards.mean(1), tau_easy=0.8, p_keep_easy=0.1, seed=1)
    # Easy by the mean of K samples: P(Binomial(10, .95) >= 8) = 0.988; hard: P(Bin(10, .3) >= 8) ~ 1.6e-3.
    assert abs(easy[truly_easy].mean() - 0.988) < 0.01 and easy[~truly_easy].mean() < 0.01
    assert keep[~easy].all()
    p, n = 0.1, easy.sum()
    assert abs(keep[easy].mean() - p) < 4 * np.sqrt(p * (1 - p) / n)  # a binomial bound
    # The paper's figure: most of the final set is medium/hard.
    assert (keep & ~easy).sum() / keep.sum() > 0.7


def test_predictor_split_is_seeded_and_disjoint():
    a, rest = difficulty.split_for_predictor(100, 0.1, seed=3)
    b, _ = difficulty.split_for_predictor(100, 0.1, seed=3)
    assert len(a) == 10 and set(a).isdisjoint(rest) and len(a) + len(rest) == 100 and list(a) == list(b)
    assert len(difficulty.split_for_predictor(5, 0.1, seed=0)[0]) == 1  # at least one
