"""Metrics out: tensorboardX scalars, a console progress line with ETA, and at the end a PNG
of the learning curves next to the logs."""

from __future__ import annotations

import json
import os
import sys
import time

from tensorboardX import SummaryWriter

from jaxscaffold.train.results import peak_and_final


def keep_steps_until(path: str, step: int) -> None:
    """Drops the lines of a JSON-lines log whose "step" is beyond `step`: a run resumed from
    its last checkpoint redoes the steps after it, and a fresh run (step 0) starts empty."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        lines = [line for line in f if line.strip() and json.loads(line).get("step", 0) <= step]
    with open(path, "w") as f:
        f.writelines(lines)


class StepLog:
    """Per-step records appended to a JSON-lines file, e.g. every feedback enrichment. The
    first write drops the lines of the steps being (re)done, so a resumed run's file holds each
    step once. `write=False` (processes other than 0) makes it a no-op."""

    def __init__(self, path: str, *, write: bool = True):
        self.path, self.enabled, self._started = path, write, False

    def write(self, step: int, records: list[dict]) -> None:
        if not self.enabled:
            return
        if not self._started:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            keep_steps_until(self.path, step - 1)
            self._started = True
        with open(self.path, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)


class MetricLogger:
    """Metrics of each step to tensorboard, `metrics.jsonl` and a console line; `write=False`
    (processes other than 0 on multi-host) makes it a no-op."""

    def __init__(self, out_dir: str, *, total_steps: int, start: int = 0, stream=sys.stderr, write: bool = True):
        self.out_dir, self.total, self.start, self.enabled = out_dir, total_steps, start, write
        self.stream, self.t0 = stream, time.perf_counter()
        if not write:
            return
        self.writer = SummaryWriter(os.path.join(out_dir, "tb"))
        path = os.path.join(out_dir, "metrics.jsonl")
        # Resumed: the steps after the checkpoint are redone; fresh: all (step 0 included).
        keep_steps_until(path, start if start else -1)
        self.jsonl = open(path, "a")

    def log(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        for k, v in metrics.items():
            if k != "step" and isinstance(v, (int, float)):
                self.writer.add_scalar(k, v, step)
        self.jsonl.write(json.dumps(metrics) + "\n")
        self.jsonl.flush()
        done = step - self.start
        eta = (time.perf_counter() - self.t0) / max(done, 1) * (self.total - step)
        bar = "#" * int(20 * step / max(self.total, 1))
        labels = {"rollout/reward": "reward", "rollout/success": "success", "train/entropy": "entropy"}
        shown = "  ".join(f"{label} {metrics[k]:.3f}" for k, label in labels.items() if k in metrics)
        arm = f"  arm {metrics['feedback/arm']}" if "feedback/arm" in metrics else ""
        print(f"\r[{bar:<20}] step {step}/{self.total}  {shown}{arm}{eval_line(metrics)}  eta {eta:.0f}s",
              file=self.stream, flush=True)

    def close(self, history: list[dict]) -> None:
        if not self.enabled:
            return
        self.writer.close()
        self.jsonl.close()
        if history:
            plot_curves(history, os.path.join(self.out_dir, "curves.png"))


def headline_keys(metrics: dict) -> list[str]:
    """The eval metrics a summary shows: `eval/score` (else the pooled `eval/success`, the
    world-model workload's) and each env's success."""
    head = ["eval/score"] if "eval/score" in metrics else ["eval/success"]
    envs = sorted(k for k in metrics if k.startswith("eval/success_") and "/" not in k[len("eval/"):]
                  and not k.endswith("_peak"))
    return [k for k in head if k in metrics] + envs


def eval_line(metrics: dict) -> str:
    """"  eval score 0.250 (peak 0.300)  sciworld 0.100  bfcl 0.400" for a row with an evaluation."""
    parts = []
    for k in headline_keys(metrics):
        label = "eval " + k[len("eval/"):] if k in ("eval/score", "eval/success") else k[len("eval/success_"):]
        peak = f" (peak {metrics[k + '_peak']:.3f})" if k + "_peak" in metrics else ""
        parts.append(f"{label} {metrics[k]:.3f}{peak}")
    return "".join("  " + p for p in parts)


def plot_curves(history: list[dict], path: str) -> None:
    """Train reward and success, the eval score and each env's eval success (peak and final in
    the legend), and entropy against the training step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax3, ax2) = plt.subplots(1, 3, figsize=(15, 3.5))
    for key, label in (("rollout/reward", "train reward"), ("rollout/success", "train success")):
        pts = [(h["step"], h[key]) for h in history if key in h]
        if pts:
            ax1.plot(*zip(*pts), label=label)
    ax1.set_xlabel("training step")
    if ax1.lines:
        ax1.legend()
    summary = peak_and_final(history)
    for key in headline_keys({k: 0 for h in history for k in h}):
        pts = [(h["step"], h[key]) for h in history if key in h]
        r = summary[key]
        ax3.plot(*zip(*pts), marker=".", label=f"{key[len('eval/'):]}: peak {r['peak']:.3f} @ {r['peak_step']}, "
                                               f"final {r['final']:.3f}")
    ax3.set_xlabel("training step")
    ax3.set_ylabel("eval success")
    ax3.set_ylim(-0.02, 1.02)
    if ax3.lines:
        ax3.legend(fontsize="small")
    pts = [(h["step"], h["train/entropy"]) for h in history if "train/entropy" in h]
    if pts:
        ax2.plot(*zip(*pts), color="tab:red")
    ax2.set_xlabel("training step")
    ax2.set_ylabel("entropy (nats/token)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
