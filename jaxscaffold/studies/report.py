"""A study's summary: `study.json` (per arm: each run's figures and their means with 95%
t-intervals; every declared contrast's per-seed differences, mean, t-interval, exact sign-flip
p-value and Holm-adjusted p-value; paired differences against the baseline) and `study.png`
(per-step curves with bands). `rereport` gives the same summary of a committed study.json."""

from __future__ import annotations

import json
import math
import os

import numpy as np

from jaxscaffold.studies import stats
from jaxscaffold.studies.runner import Contrast, Study, finished

FIGURES = ("peak", "final", "auc", "eval_variability", "first_informative_step", "informative_share",
           "reward_variability")


def declared_contrasts(study: Study) -> tuple[Contrast, ...]:
    """The study's contrasts; none declared: every arm against the baseline on the primary metric."""
    if study.contrasts or study.baseline is None:
        return study.contrasts
    return tuple(Contrast(arm, study.baseline, study.primary) for arm in study.arms if arm != study.baseline)


def contrast_table(runs: dict[str, dict[int, dict]], contrasts) -> list[dict]:
    """Each contrast's numbers from the runs' figures ({arm: {seed: run}}): `stats.paired`'s,
    and `p_holm`, Holm-adjusted over the confirmatory (not exploratory) contrasts (None for an
    exploratory one)."""
    rows = []
    for c in contrasts:
        values = {arm: {s: stats.run_metric(r, c.metric, c.step) for s, r in runs.get(arm, {}).items()}
                  for arm in (c.a, c.b)}
        rows.append({"name": c.name, "a": c.a, "b": c.b, "metric": c.metric, "step": c.step,
                     "exploratory": c.exploratory, "hypothesis": c.hypothesis,
                     **stats.paired(values[c.a], values[c.b])})
    family = [i for i, r in enumerate(rows) if not r["exploratory"]]
    adjusted = stats.holm([rows[i]["p"] for i in family])
    for row in rows:
        row["p_holm"] = None
    for i, p in zip(family, adjusted):
        rows[i]["p_holm"] = p
    return rows


def summarise_runs(study: Study, runs: dict[str, dict[int, dict]], missing: list) -> dict:
    """The study's summary from each run's figures ({arm: {seed: summarise_run's dict}})."""
    arms = {arm: {"runs": {str(s): r for s, r in runs.get(arm, {}).items()},
                  **{k: stats.mean_interval([r.get(k) for r in runs.get(arm, {}).values()]) for k in FIGURES}}
            for arm in study.arms}
    paired = {}
    if study.baseline is not None:
        for arm in study.arms:
            if arm != study.baseline:
                paired[arm] = {k: stats.paired({s: r.get(k) for s, r in runs.get(arm, {}).items()},
                                               {s: r.get(k) for s, r in runs.get(study.baseline, {}).items()})
                               for k in ("peak", "final")}
    return {"study": study.name, "score": study.score, "seeds": list(study.seeds), "baseline": study.baseline,
            "primary": study.primary, "arms": arms, "contrasts": contrast_table(runs, declared_contrasts(study)),
            "paired_vs_baseline": paired, "missing": missing}


def summarise(study: Study) -> tuple[dict, dict]:
    """(the study's figures from the finished runs, unfinished ones listed as missing; each
    finished run's history by (arm, seed))."""
    runs, missing, histories = {}, [], {}
    for arm in study.arms:
        runs[arm] = {}
        for seed in study.seeds:
            record = finished(study, arm, seed)
            if record is None:
                missing.append({"arm": arm, "seed": seed})
                continue
            histories[(arm, seed)] = record["history"]
            runs[arm][seed] = stats.summarise_run(record["history"], score=study.score)
    return summarise_runs(study, runs, missing), histories


def rereport(study: Study, committed: dict, scores_at: dict | None = None) -> dict:
    """The summary of a committed study.json (per-run figures, not histories) with the study
    file's contrasts. `scores_at` ({"arms": {arm: {seed: {step: score}}}}) adds eval scores
    the committed JSON lacks (its per-run eval curve); the final score closes each curve."""
    runs = {arm: {int(s): dict(r) for s, r in a["runs"].items()} for arm, a in committed["arms"].items()}
    for arm, by_seed in ((scores_at or {}).get("arms") or {}).items():
        for seed, points in by_seed.items():
            run = runs[arm][int(seed)]
            curve = {int(step): float(v) for step, v in points.items()}
            last = max(curve)
            if run.get("final") is not None and not math.isclose(curve[last], run["final"]):
                raise ValueError(f"{arm} seed {seed}: score at step {last} {curve[last]} is not the JSON's final "
                                 f"{run['final']}")
            steps = sorted(curve)
            run.update(stats.curve_figures(steps, [curve[s] for s in steps]),
                       eval_curve={"steps": steps, "values": [curve[s] for s in steps]})
            run["peak"] = max(run["peak"], committed["arms"][arm]["runs"][str(seed)]["peak"])  # unlisted steps
    return summarise_runs(study, runs, committed.get("missing", []))


def markdown(summary: dict, *, digits: int = 3) -> str:
    """The summary's tables in Markdown: per arm the figures' means [95% t-interval], then every
    contrast (per-seed differences, mean [t-interval], sign-flip p, Holm p)."""
    def num(v):
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"

    figures = [k for k in FIGURES if any(a[k]["n"] for a in summary["arms"].values())]
    lines = ["| arm | n | " + " | ".join(figures) + " |", "|---|---|" + "---|" * len(figures)]
    for arm, a in summary["arms"].items():
        cells = [f"{num(a[k]['mean'])} [{num(a[k]['low'])}, {num(a[k]['high'])}]" for k in figures]
        lines.append(f"| {arm} | {max(a[k]['n'] for k in figures)} | " + " | ".join(cells) + " |")
    lines += ["", "| contrast | confirmatory | per-seed differences | mean [95% t-interval] | sign-flip p | Holm p |",
              "|---|---|---|---|---|---|"]
    for c in summary["contrasts"]:
        diffs = ", ".join(f"{d:+.{digits}f}" for d in c["diffs"])
        kind = "exploratory" if c["exploratory"] else "yes" + (f" ({c['hypothesis']})" if c["hypothesis"] else "")
        lines.append(f"| {c['name']} | {kind} | {diffs or 'none'} | {num(c['mean'])} [{num(c['low'])}, "
                     f"{num(c['high'])}] | {num(c['p'])} | {num(c['p_holm'])} |")
    return "\n".join(lines) + "\n"


def _band(histories: list, key: str, t_band: bool):
    """(steps, mean, low, high) over runs: a 95% t-interval of the mean (`t_band`) or min-max."""
    curves = [dict(zip(*stats.series(h, key))) for h in histories]
    steps = sorted(set().union(*curves)) if curves else []
    values = [[c[s] for c in curves if s in c] for s in steps]
    if t_band:
        ivs = [stats.mean_interval(v) for v in values]
        return steps, [i["mean"] for i in ivs], [i["low"] for i in ivs], [i["high"] for i in ivs]
    return steps, [float(np.mean(v)) for v in values], [min(v) for v in values], [max(v) for v in values]


def plot(study: Study, histories: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = ((study.score, "eval score per evaluated step: mean, 95% t-interval", True),
              ("rollout/reward", "train reward: mean, min-max", False),
              ("rollout/informative_groups", "informative groups: mean, min-max", False),
              ("train/entropy", "entropy: mean, min-max", False))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6))
    for ax, (key, title, t_band) in zip(axes, panels):
        for arm in study.arms:
            runs = [h for (a, _), h in histories.items() if a == arm]
            steps, mean, low, high = _band(runs, key, t_band)
            if steps:
                line, = ax.plot(steps, mean, marker="o" if t_band else None, label=f"{arm} (n={len(runs)})")
                ax.fill_between(steps, low, high, alpha=0.15, color=line.get_color())
        ax.set_title(title, fontsize=9)
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
