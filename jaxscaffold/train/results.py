"""A run's results from its history: the peak and the final value of every evaluation metric
(the paper reports the peak of its every-5-steps evaluation; the final value says whether the
peak held), the running peaks of the headline metrics, and `out_dir/results.json`."""

from __future__ import annotations

import json
import os
from typing import Sequence

# The metrics whose running peak each evaluation row carries ("<name>_peak"): `eval/score`
# (the paper's average) and `eval/success` (every episode pooled; kept for the world-model
# workload, whose only score it is).
HEADLINE = ("eval/score", "eval/success")
PEAK_SUFFIX = "_peak"


def is_eval_metric(key: str, value) -> bool:
    return (key.startswith("eval/") and not key.endswith(PEAK_SUFFIX) and isinstance(value, (int, float))
            and not isinstance(value, bool))


def running_peaks(history: Sequence[dict], row: dict) -> dict[str, float]:
    """`<headline>_peak` of each headline metric in `row`: the best of the history and `row`."""
    return {k + PEAK_SUFFIX: max([h[k] for h in history if k in h] + [row[k]]) for k in HEADLINE if k in row}


def peak_and_final(history: Sequence[dict]) -> dict[str, dict]:
    """{metric: {"peak", "peak_step", "final", "final_step", "evaluations"}} of every eval
    metric in `history` (rows with a "step"); the peak is the first step reaching the maximum."""
    out: dict[str, dict] = {}
    for h in history:
        for k, v in h.items():
            if not is_eval_metric(k, v):
                continue
            r = out.setdefault(k, {"peak": v, "peak_step": h["step"], "evaluations": 0})
            if v > r["peak"]:
                r["peak"], r["peak_step"] = v, h["step"]
            r["final"], r["final_step"] = v, h["step"]
            r["evaluations"] += 1
    return {k: out[k] for k in sorted(out)}


def results(history: Sequence[dict], *, total_steps: int) -> dict:
    """What results.json holds: the last step reached, the run's length, and `peak_and_final`."""
    return {"step": max((h["step"] for h in history), default=0), "total_steps": total_steps,
            "eval": peak_and_final(history)}


def write_results(out_dir: str, history: Sequence[dict], *, total_steps: int) -> str:
    """Writes `out_dir/results.json` atomically (a killed run leaves the last complete one)."""
    path = os.path.join(out_dir, "results.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results(history, total_steps=total_steps), f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    return path
