"""Group-relative advantages from outcome rewards (host side: rewards are small).

One score per trajectory (the sum of its rewards, computed by the caller), grouped by task:
rollouts of the *same* task share a group id. Estimators, per group of n scores `s`:

- `grpo`:   `(s - mean) / (std + eps)`, unbiased std (ddof=1); the algorithm's `norm_std=False`
            gives `s - mean`;
- `drgrpo`: `s - mean` (Dr.GRPO, arXiv 2503.20783: no std normalisation);
- `rloo`:   `s - mean of the other n-1 scores` (leave-one-out baseline, arXiv 2402.14740).

A group of one has no baseline: every estimator keeps the raw score `A = s` (as verl's GRPO,
Dr.GRPO and RLOO do: its GRPO divides by std 1 + eps, which we drop so `A = s` exactly).

Step-wise samples (one row per env step, several rows per trajectory) pass `traj_ids_N`; all
rows of a trajectory must carry the same reward and group. `count` chooses what the group
statistics count:

- `"trajectory"` (default): each trajectory once, whatever its number of steps, then its
  advantage is broadcast to all its rows. Long episodes do not weigh more in the baseline.
- `"row"`: every row is one sample (what a flat step-wise batch gives when group statistics
  are taken over rows, as in the reference code's step-wise pipeline).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the algorithm's config; presets.py validates its estimator against ESTIMATORS
    from jaxscaffold.rl.presets import AlgorithmConfig

ESTIMATORS = ("grpo", "drgrpo", "rloo")
COUNTS = ("trajectory", "row")


def informative(values_G) -> bool:
    """Whether a group teaches anything: more than one value and not all equal (otherwise every
    estimator's group-relative advantage is zero). The one definition of an informative group;
    callers choose the values: DAPO's dynamic sampler the binary successes, the bandit's signal
    and the rollout metrics the rewards."""
    v = np.asarray(values_G, np.float64)
    return bool(v.size > 1 and np.ptp(v) > 0)


def advantages(
    rewards_N,
    group_ids_N,
    algo: AlgorithmConfig,
    *,
    eps: float = 1e-6,
    batch_norm: bool = False,
    traj_ids_N=None,
    count: str = "trajectory",
):
    """Per-row advantages `adv_N` (float32 NumPy) from per-row scores and group ids.

    Args:
      rewards_N: one score per row (a trajectory's total reward; step rows repeat it).
      group_ids_N: group (task) id per row, any NumPy-sortable values.
      algo: the algorithm (`rl.presets.AlgorithmConfig`): its `estimator`, "grpo", "drgrpo" or
        "rloo" (see the module docstring), and `norm_std`, whether to divide by the group std
        (only "grpo" uses it; False = Dr.GRPO's mean-only form).
      eps: added to the std in the divisions (group std and batch std).
      batch_norm: afterwards z-score the advantages over the whole batch (unbiased std + eps),
        over the same units the group statistics count (trajectories or rows).
      traj_ids_N: trajectory id per row for step-wise rows; None = every row is a trajectory.
      count: "trajectory" or "row", what group statistics count when `traj_ids_N` is given.

    Raises:
      ValueError: unknown option, mismatched shapes, or rows of one trajectory that disagree on
        their reward or group.
    """
    estimator = algo.estimator
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; expected one of {ESTIMATORS}")
    if count not in COUNTS:
        raise ValueError(f"unknown count {count!r}; expected one of {COUNTS}")
    rewards_N = np.asarray(rewards_N, np.float64)
    group_ids_N = np.asarray(group_ids_N)
    if rewards_N.ndim != 1 or group_ids_N.shape != rewards_N.shape:
        raise ValueError(f"rewards {rewards_N.shape} and group ids {group_ids_N.shape} must be equal 1-D")

    if traj_ids_N is not None:
        traj_ids_N = np.asarray(traj_ids_N)
        if traj_ids_N.shape != rewards_N.shape:
            raise ValueError(f"traj ids {traj_ids_N.shape} must match rewards {rewards_N.shape}")
        _check_trajectories(rewards_N, group_ids_N, traj_ids_N)

    if traj_ids_N is not None and count == "trajectory":
        _, unit_of_row_N = np.unique(traj_ids_N, return_inverse=True)
    else:
        unit_of_row_N = np.arange(rewards_N.shape[0])
    # One score and group per unit (trajectory or row); its first row speaks for it.
    first_row_U = _first_rows(unit_of_row_N)
    adv_U = _group_advantages(rewards_N[first_row_U], group_ids_N[first_row_U], estimator, eps, algo.norm_std)
    if batch_norm:
        adv_U = _zscore(adv_U, eps)
    return adv_U[unit_of_row_N].astype(np.float32)


def _first_rows(unit_of_row_N):
    """Index of the first row of every unit, for units numbered 0..U-1."""
    n_units = int(unit_of_row_N.max()) + 1 if unit_of_row_N.size else 0
    first_U = np.zeros(n_units, np.int64)
    # Reversed assignment: the last write per unit is its first row.
    first_U[unit_of_row_N[::-1]] = np.arange(unit_of_row_N.size)[::-1]
    return first_U


def _check_trajectories(rewards_N, group_ids_N, traj_ids_N):
    """Step rows of a trajectory must agree on reward and group, or the broadcast is undefined."""
    _, t_N = np.unique(traj_ids_N, return_inverse=True)
    ref_N = _first_rows(t_N)[t_N]
    for what, values_N in (("rewards", rewards_N), ("groups", group_ids_N)):
        bad = np.flatnonzero(values_N != values_N[ref_N])
        if bad.size:
            row, ref = int(bad[0]), int(ref_N[bad[0]])
            first, other = values_N[[ref, row]].tolist()  # plain Python values for the message
            hint = "; attach the episode's score to every step row" if what == "rewards" else ""
            raise ValueError(
                f"trajectory {traj_ids_N[row].item()!r} has rows with different {what} "
                f"({first!r} at row {ref}, {other!r} at row {row}){hint}"
            )


def _group_advantages(s_U, group_U, estimator, eps, norm_std):
    _, g_U = np.unique(group_U, return_inverse=True)
    n_G = np.bincount(g_U).astype(np.float64)
    sum_G = np.bincount(g_U, weights=s_U)
    mean_U = (sum_G / n_G)[g_U]
    n_U = n_G[g_U]
    multi_U = n_U > 1
    safe_n1_U = np.where(multi_U, n_U - 1, 1.0)
    if estimator == "rloo":
        adv_U = s_U - (sum_G[g_U] - s_U) / safe_n1_U
    elif estimator == "grpo" and norm_std:
        var_G = np.bincount(g_U, weights=(s_U - mean_U) ** 2)
        std_U = np.sqrt(var_G[g_U] / safe_n1_U)
        adv_U = (s_U - mean_U) / (std_U + eps)
    else:  # drgrpo, or grpo without std
        adv_U = s_U - mean_U
    # No baseline exists for a group of one: keep the raw score.
    return np.where(multi_U, adv_U, s_U)


def _zscore(x_U, eps):
    if x_U.size < 2:
        return x_U - x_U.mean() if x_U.size else x_U
    return (x_U - x_U.mean()) / (x_U.std(ddof=1) + eps)
