"""The difficulty filter: keep the transitions a light predictor cannot already get right.

A predictor SFT'd on a small share of the triples samples K predictions for each remaining
triple; a triple whose mean reward reaches tau_easy is "easy" and kept only with probability
p_keep_easy (the paper: 10% SFT share, K = 10, p = 0.1, ~70% of the final set medium/hard).
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class FilterConfig:
    sft_share: float = 0.1  # share of the triples the light predictor is fine-tuned on
    samples: int = 10  # K predictions per remaining triple
    tau_d: float = 0.1  # distance threshold of the filter's reward (the paper's ALFWorld value)
    tau_easy: float = 0.8  # mean reward at or above which a triple is easy (not given in the paper)
    p_keep_easy: float = 0.1  # probability an easy triple stays


def split_for_predictor(n: int, share: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices the predictor trains on, the rest), a seeded random split."""
    order = np.random.default_rng(seed).permutation(n)
    k = int(round(share * n)) if n else 0
    k = min(max(k, 1 if n > 1 else 0), n - 1) if n > 1 else 0
    return np.sort(order[:k]), np.sort(order[k:])


def keep_mask(mean_rewards: np.ndarray, tau_easy: float, p_keep_easy: float, seed: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """(keep, easy) boolean masks over triples given each one's mean reward over K samples."""
    mean_rewards = np.asarray(mean_rewards, np.float64)
    easy = mean_rewards >= tau_easy
    coin = np.random.default_rng(seed).random(len(mean_rewards)) < p_keep_easy
    return ~easy | coin, easy
