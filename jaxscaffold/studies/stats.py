"""The statistics a study reports: per-run summaries of a training history, percentile
bootstrap intervals of a mean, and paired differences between arms over shared seeds."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

LEVEL = 0.95
RESAMPLES = 10_000


def bootstrap_mean(values: Sequence[float], *, level: float = LEVEL, resamples: int = RESAMPLES,
                   seed: int = 0) -> dict:
    """{"mean", "low", "high", "n"}: the mean and its percentile-bootstrap interval (one value:
    the interval is the value itself; none: NaNs)."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], np.float64)
    if x.size == 0:
        return {"mean": math.nan, "low": math.nan, "high": math.nan, "n": 0}
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, (resamples, x.size))].mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return {"mean": float(x.mean()), "low": float(low), "high": float(high), "n": int(x.size)}


def paired_difference(arm: Mapping[int, float], baseline: Mapping[int, float], **kwargs) -> dict:
    """The mean of arm - baseline over the seeds both have, with its bootstrap interval, and
    whether the interval excludes 0."""
    seeds = sorted(set(arm) & set(baseline))
    out = bootstrap_mean([arm[s] - baseline[s] for s in seeds], **kwargs)
    out["seeds"] = seeds
    out["excludes_zero"] = bool(out["n"] > 1 and (out["low"] > 0 or out["high"] < 0))
    return out


def series(history: Sequence[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric over a run's history (steps that logged it)."""
    pts = [(int(h["step"]), float(h[key])) for h in history if key in h and h[key] is not None]
    return [s for s, _ in pts], [v for _, v in pts]


def summarise_run(history: Sequence[dict], *, score: str, reward: str = "rollout/reward",
                  informative: str = "rollout/informative_groups", entropy: str = "train/entropy") -> dict:
    """One run's figures: peak and final of the eval score, the first step with an informative
    group, the share of informative groups over training, the train reward's mean absolute
    step-to-step change (its variability), and the entropy curve."""
    _, scores = series(history, score)
    _, rewards = series(history, reward)
    steps, inform = series(history, informative)
    first = next((s for s, v in zip(steps, inform) if v > 0), None)
    return {"peak": max(scores) if scores else None, "final": scores[-1] if scores else None,
            "first_informative_step": first,
            "informative_share": float(np.mean(inform)) if inform else None,
            "reward_variability": float(np.mean(np.abs(np.diff(rewards)))) if len(rewards) > 1 else None,
            "entropy": dict(zip(("steps", "values"), series(history, entropy)))}
