"""The statistics a study reports, built to keep their promise at 5-10 seeds.

- Per run (`summarise_run`): the eval curve, its final, peak, area under it and step-to-step
  variability; the first step with an informative group, their share, the train reward's
  variability and the entropy curve.
- Per contrast (`paired`): arm a - arm b over the seeds both have: the per-seed differences,
  their mean, a Student-t interval (its coverage is close to nominal at n = 5 for the
  near-symmetric differences of paired binomial scores, where a percentile bootstrap's is not:
  tests/studies/test_stats.py simulates it) and an exact two-sided sign-flip p-value.
- Over a study's declared contrasts: Holm's step-down adjusted p-values (`holm`).

A percentile bootstrap (`bootstrap_mean`) is kept for large samples only: over 5 seeds its 95%
interval excludes a true null difference in ~15% of studies.
"""

from __future__ import annotations

import functools
import math
from typing import Mapping, Sequence

import numpy as np

LEVEL = 0.95
RESAMPLES = 10_000
EXACT_UP_TO = 16  # sign-flip: all 2^n patterns up to here, a seeded Monte-Carlo beyond
SIGN_FLIP_RESAMPLES = 200_000


def _finite(values) -> np.ndarray:
    return np.asarray([v for v in values if v is not None and math.isfinite(v)], np.float64)


def sign_flip_p(diffs: Sequence[float], *, resamples: int = SIGN_FLIP_RESAMPLES, seed: int = 0) -> float:
    """The two-sided paired sign-flip (permutation) p-value of `diffs` (one difference per seed;
    None / NaN dropped): the share of sign patterns whose |sum| is at least the observed |sum|.
    Exact (all 2^n patterns) up to n = 16; beyond, `resamples` seeded random patterns, (1 + hits)
    / (1 + resamples). Zero differences stay in (either sign gives the same sum). No difference:
    NaN. With n seeds the smallest possible p is 2 / 2^n (0.0625 at n = 5)."""
    d = _finite(diffs)
    if d.size == 0:
        return math.nan
    observed = abs(d.sum())
    tol = 1e-9 * max(1.0, float(np.abs(d).sum()))  # sums equal up to rounding count as ties
    if d.size <= EXACT_UP_TO:
        bits = (np.arange(2 ** d.size)[:, None] >> np.arange(d.size)) & 1
        sums = (1 - 2 * bits) @ d
        return float(np.mean(np.abs(sums) >= observed - tol))
    rng, hits, left = np.random.default_rng(seed), 0, resamples
    while left:  # in chunks: a 200,000 x n sign matrix at once is large for big n
        k = min(left, 20_000)
        sums = rng.choice((-1.0, 1.0), size=(k, d.size)) @ d
        hits += int(np.sum(np.abs(sums) >= observed - tol))
        left -= k
    return (1 + hits) / (1 + resamples)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order: the i-th smallest of m is
    max over j <= i of min(1, (m - j + 1) p_(j)). None / NaN stay NaN and do not count in m."""
    p = np.asarray([math.nan if v is None else v for v in pvalues], np.float64)
    out = np.full(p.shape, math.nan)
    idx = np.flatnonzero(np.isfinite(p))
    order = idx[np.argsort(p[idx], kind="stable")]
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p[i]))
        out[i] = running
    return out.tolist()


@functools.lru_cache(maxsize=256)
def t_quantile(prob: float, df: int) -> float:
    """The Student-t quantile (0.5 < prob < 1, df >= 1): bisection on the CDF, integrated
    numerically from the density (no SciPy at run time; checked against scipy.stats.t.ppf)."""
    if not 0.5 < prob < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < prob < 1 and df >= 1, got {prob}, {df}")
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(t):  # Simpson's rule on [0, t], 0.5 + the integral
        x = np.linspace(0.0, t, 4001)
        f = np.exp(log_c - (df + 1) / 2 * np.log1p(x * x / df))
        return 0.5 + (x[1] - x[0]) / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())

    low, high = 0.0, 1.0
    while cdf(high) < prob:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < prob else (low, mid)
    return (low + high) / 2


def mean_interval(values: Sequence[float], *, level: float = LEVEL) -> dict:
    """{"mean", "low", "high", "n"}: the mean and its Student-t interval (one value: the value
    itself; none: NaNs)."""
    x = _finite(values)
    if x.size == 0:
        return {"mean": math.nan, "low": math.nan, "high": math.nan, "n": 0}
    mean = float(x.mean())
    half = t_quantile((1 + level) / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size) if x.size > 1 else 0.0
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": int(x.size)}


def paired(a: Mapping[int, float], b: Mapping[int, float], *, level: float = LEVEL) -> dict:
    """a - b over the seeds both have (a value that is None / NaN drops its seed): the seeds,
    per-seed differences, their mean with its t-interval, whether that interval excludes 0,
    and the exact two-sided sign-flip p-value."""
    seeds = sorted(s for s in set(a) & set(b) if _finite([a[s], b[s]]).size == 2)
    diffs = [float(a[s] - b[s]) for s in seeds]
    out = mean_interval(diffs, level=level)
    out.update(seeds=seeds, diffs=diffs, p=sign_flip_p(diffs),
               excludes_zero=bool(out["n"] > 1 and (out["low"] > 0 or out["high"] < 0)))
    return out


def bootstrap_mean(values: Sequence[float], *, level: float = LEVEL, resamples: int = RESAMPLES,
                   seed: int = 0) -> dict:
    """{"mean", "low", "high", "n"}: the mean and its percentile-bootstrap interval (one value:
    the interval is the value itself; none: NaNs). Under-covers at a few seeds: use
    `mean_interval` there."""
    x = _finite(values)
    if x.size == 0:
        return {"mean": math.nan, "low": math.nan, "high": math.nan, "n": 0}
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, (resamples, x.size))].mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return {"mean": float(x.mean()), "low": float(low), "high": float(high), "n": int(x.size)}


def paired_difference(arm: Mapping[int, float], baseline: Mapping[int, float], **kwargs) -> dict:
    """The mean of arm - baseline over the seeds both have, with its bootstrap interval, and
    whether the interval excludes 0 (kept for large samples; `paired` is a study's contrast)."""
    seeds = sorted(set(arm) & set(baseline))
    out = bootstrap_mean([arm[s] - baseline[s] for s in seeds], **kwargs)
    out["seeds"] = seeds
    out["excludes_zero"] = bool(out["n"] > 1 and (out["low"] > 0 or out["high"] < 0))
    return out


def series(history: Sequence[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric over a run's history (steps that logged it)."""
    pts = [(int(h["step"]), float(h[key])) for h in history if key in h and h[key] is not None]
    return [s for s, _ in pts], [v for _, v in pts]


def curve_figures(steps: Sequence[int], values: Sequence[float]) -> dict:
    """An eval curve's figures: peak, final, AUC (the trapezoid area over the evaluated steps
    divided by their span: the curve's mean height; one point: its value) and variability
    (mean absolute change between consecutive evaluations; one point: None)."""
    if not values:
        return {"peak": None, "final": None, "auc": None, "eval_variability": None}
    auc = (float(np.trapezoid(values, steps) / (steps[-1] - steps[0])) if len(values) > 1 and steps[-1] > steps[0]
           else float(np.mean(values)))
    return {"peak": max(values), "final": values[-1], "auc": auc,
            "eval_variability": float(np.mean(np.abs(np.diff(values)))) if len(values) > 1 else None}


def summarise_run(history: Sequence[dict], *, score: str, reward: str = "rollout/reward",
                  informative: str = "rollout/informative_groups", entropy: str = "train/entropy") -> dict:
    """One run's figures: the eval curve and its `curve_figures`, the first step with an
    informative group, the share of informative groups over training, the train reward's mean
    absolute step-to-step change (its variability), and the entropy curve."""
    eval_steps, scores = series(history, score)
    _, rewards = series(history, reward)
    steps, inform = series(history, informative)
    first = next((s for s, v in zip(steps, inform) if v > 0), None)
    return {**curve_figures(eval_steps, scores), "eval_curve": {"steps": eval_steps, "values": scores},
            "first_informative_step": first,
            "informative_share": float(np.mean(inform)) if inform else None,
            "reward_variability": float(np.mean(np.abs(np.diff(rewards)))) if len(rewards) > 1 else None,
            "entropy": dict(zip(("steps", "values"), series(history, entropy)))}


def run_metric(run: Mapping, metric: str, step: int | None = None) -> float | None:
    """One run's value of a contrast's metric: a figure of `summarise_run`, or with `step`
    the eval score at that step (None where the run has none)."""
    if step is None:
        value = run.get(metric)
        return None if value is None else float(value)
    curve = run.get("eval_curve") or {}
    at = dict(zip(curve.get("steps", []), curve.get("values", [])))
    return at.get(step)
