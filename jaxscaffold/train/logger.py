"""Metrics out: tensorboardX scalars, a console progress line with ETA, and at the end a PNG
of the learning curves next to the logs."""

from __future__ import annotations

import json
import os
import sys
import time

from tensorboardX import SummaryWriter


class MetricLogger:
    def __init__(self, out_dir: str, *, total_steps: int, start: int = 0, stream=sys.stderr):
        self.out_dir, self.total, self.start = out_dir, total_steps, start
        self.writer = SummaryWriter(os.path.join(out_dir, "tb"))
        self.jsonl = open(os.path.join(out_dir, "metrics.jsonl"), "a")
        self.stream, self.t0 = stream, time.perf_counter()

    def log(self, step: int, metrics: dict) -> None:
        for k, v in metrics.items():
            if k != "step" and isinstance(v, (int, float)):
                self.writer.add_scalar(k, v, step)
        self.jsonl.write(json.dumps(metrics) + "\n")
        self.jsonl.flush()
        done = step - self.start
        eta = (time.perf_counter() - self.t0) / max(done, 1) * (self.total - step)
        bar = "#" * int(20 * step / max(self.total, 1))
        shown = "  ".join(f"{k.split('/')[-1]} {metrics[k]:.3f}" for k in
                          ("rollout/reward", "rollout/success", "eval/success", "train/entropy") if k in metrics)
        print(f"\r[{bar:<20}] step {step}/{self.total}  {shown}  eta {eta:.0f}s", file=self.stream, flush=True)

    def close(self, history: list[dict]) -> None:
        self.writer.close()
        self.jsonl.close()
        if history:
            plot_curves(history, os.path.join(self.out_dir, "curves.png"))


def plot_curves(history: list[dict], path: str) -> None:
    """Train and eval success (and reward) and entropy against the training step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
    for key, label in (("rollout/reward", "train reward"), ("rollout/success", "train success"),
                       ("eval/reward", "eval reward"), ("eval/success", "eval success")):
        pts = [(h["step"], h[key]) for h in history if key in h]
        if pts:
            ax1.plot(*zip(*pts), marker="." if key.startswith("eval") else None, label=label)
    ax1.set_xlabel("training step")
    ax1.legend()
    pts = [(h["step"], h["train/entropy"]) for h in history if "train/entropy" in h]
    if pts:
        ax2.plot(*zip(*pts), color="tab:red")
    ax2.set_xlabel("training step")
    ax2.set_ylabel("entropy (nats/token)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
