"""A study's summary: `study.json` (per arm: each run's figures, their means with 95% bootstrap
intervals; paired differences against the baseline over shared seeds) and `study.png`."""

from __future__ import annotations

import json
import math
import os

import numpy as np

from jaxscaffold.studies import stats
from jaxscaffold.studies.runner import Study, finished

FIGURES = ("peak", "final", "first_informative_step", "informative_share", "reward_variability")


def summarise(study: Study) -> tuple[dict, dict]:
    """(the study's figures from the finished runs, unfinished ones listed as missing; each
    finished run's history by (arm, seed))."""
    arms, missing, histories = {}, [], {}
    for arm in study.arms:
        runs = {}
        for seed in study.seeds:
            record = finished(study, arm, seed)
            if record is None:
                missing.append({"arm": arm, "seed": seed})
                continue
            histories[(arm, seed)] = record["history"]
            runs[seed] = stats.summarise_run(record["history"], score=study.score)
        arms[arm] = {"runs": {str(s): r for s, r in runs.items()},
                     **{k: stats.bootstrap_mean([r[k] for r in runs.values()]) for k in FIGURES}}
    paired = {}
    if study.baseline is not None:
        base = {int(s): r for s, r in arms[study.baseline]["runs"].items()}
        for arm in study.arms:
            if arm == study.baseline:
                continue
            mine = {int(s): r for s, r in arms[arm]["runs"].items()}
            paired[arm] = {k: stats.paired_difference(
                {s: r[k] for s, r in mine.items() if r[k] is not None},
                {s: r[k] for s, r in base.items() if r[k] is not None}) for k in ("peak", "final")}
    return {"study": study.name, "score": study.score, "seeds": list(study.seeds), "baseline": study.baseline,
            "arms": arms, "paired_vs_baseline": paired, "missing": missing}, histories


def _mean_curve(histories: list, key: str):
    curves = [dict(zip(*stats.series(h, key))) for h in histories]
    steps = sorted(set().union(*curves)) if curves else []
    values = [[c[s] for c in curves if s in c] for s in steps]
    return steps, [float(np.mean(v)) for v in values], [min(v) for v in values], [max(v) for v in values]


def plot(study: Study, histories: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = ((study.score, "eval score"), ("rollout/reward", "train reward"),
              ("rollout/informative_groups", "informative groups"), ("train/entropy", "entropy"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6))
    for ax, (key, title) in zip(axes, panels):
        for arm in study.arms:
            runs = [h for (a, _), h in histories.items() if a == arm]
            steps, mean, low, high = _mean_curve(runs, key)
            if steps:
                ax.plot(steps, mean, label=f"{arm} (n={len(runs)})")
                ax.fill_between(steps, low, high, alpha=0.15)
        ax.set_title(f"{title}: mean, min-max over seeds")
        ax.set_xlabel("step")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def json_safe(obj):
    """`obj` with every NaN as None: study.json is strict JSON (an arm with no informative
    group has no first informative step; Python would write NaN, which JSON parsers refuse)."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def write_report(study: Study) -> dict:
    """Writes study.json (strict JSON: NaN as null) and study.png in the study's out_dir;
    returns the summary."""
    summary, histories = summarise(study)
    os.makedirs(study.out_dir, exist_ok=True)
    with open(os.path.join(study.out_dir, "study.json"), "w") as f:
        json.dump(json_safe(summary), f, indent=1, allow_nan=False)
    if histories:
        plot(study, histories, os.path.join(study.out_dir, "study.png"))
    return summary
