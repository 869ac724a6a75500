"""Metrics out: a console progress line with an ETA (evaluations included), `metrics.jsonl`,
backends behind one interface (`scalars`, `close`): TensorBoard always (scalars, the run's
hyperparameters in its HParams tab and the config as text), Weights & Biases when
`logging.wandb` asks (offline too); at the end a PNG of the learning curves next to the logs."""

from __future__ import annotations

import json
import os
import sys
import time


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


def flat_hparams(config: dict, prefix: str = "") -> dict[str, bool | int | float | str]:
    """A config dict as TensorBoard hparams: dotted names, values a bool, number or string."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flat_hparams(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return out


class TensorBoard:
    """Scalars to out_dir/tb; the run's config as hyperparameters (HParams tab) and as text."""

    METRICS = ("rollout/reward", "rollout/success", "eval/success", "eval/success_peak")

    def __init__(self, out_dir: str, config: dict | None = None):
        from tensorboardX import SummaryWriter
        from tensorboardX.summary import hparams
        self.writer = SummaryWriter(os.path.join(out_dir, "tb"))
        self._end = None
        if config is not None:
            # In the scalars' own run (add_hparams would open a sub-run per call).
            exp, start, self._end = hparams(flat_hparams(config), {k: 0.0 for k in self.METRICS})
            self.writer.file_writer.add_summary(exp)
            self.writer.file_writer.add_summary(start)
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```")

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)

    def close(self) -> None:
        if self._end is not None:
            self.writer.file_writer.add_summary(self._end)
        self.writer.close()


class Wandb:
    """Scalars to Weights & Biases (the optional `wandb` package): `mode` "online", or
    "offline" (files under out_dir/wandb; `wandb sync` uploads them later). The run is named
    after out_dir, with an id derived from its path: a resumed run continues the same wandb run
    (steps it redoes after its checkpoint are ones wandb already has, which it skips)."""

    def __init__(self, out_dir: str, *, mode: str, project: str, config: dict | None = None):
        import hashlib

        import wandb
        path = os.path.abspath(out_dir)
        run_id = os.path.basename(path)[:40] + "-" + hashlib.sha1(path.encode()).hexdigest()[:8]
        self.run = wandb.init(project=project, name=os.path.basename(path), id=run_id, resume="allow", dir=path,
                              mode=mode, config=config, settings=wandb.Settings(console="off", silent=True))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


def eta_s(*, step: int, total: int, start: int, elapsed_s: float, eval_s: float, evals: int,
          eval_every: int, eval_total_s: float | None = None) -> tuple[float, int]:
    """(seconds left, evaluations left whose time is not known yet). A training step costs the
    wall time since step `start` less the evaluations' in it (`eval_s`) over the steps since;
    each evaluation still due (every `eval_every` steps) the mean of the `evals` measured
    (`eval_total_s`, default `eval_s`, over them)."""
    per_step = max(elapsed_s - eval_s, 0.0) / max(step - start, 1)
    due = sum(1 for k in range(step + 1, total + 1) if eval_every and k % eval_every == 0)
    if evals:
        return per_step * (total - step) + (eval_s if eval_total_s is None else eval_total_s) / evals * due, 0
    return per_step * (total - step), due


def duration(seconds: float) -> str:
    """42s, 12m05s, 3h04m."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class MetricLogger:
    """Metrics of each step to the backends (TensorBoard, optionally wandb), `metrics.jsonl` and
    a console line; `write=False` (processes other than 0 on multi-host) makes it a no-op.
    `config` (the run's, as a dict) is logged as hyperparameters; `eval_every` lets the ETA
    count the evaluations still due (their time is read from the metrics' "time/eval_s")."""

    def __init__(self, out_dir: str, *, total_steps: int, start: int = 0, stream=sys.stderr, write: bool = True,
                 eval_every: int = 0, config: dict | None = None, wandb: str = "off",
                 wandb_project: str = "jaxscaffold", clock=time.perf_counter):
        self.out_dir, self.total, self.start, self.enabled = out_dir, total_steps, start, write
        self.stream, self.clock, self.eval_every = stream, clock, eval_every
        self.t0 = time.perf_counter()  # metrics.jsonl rows carry the wall clock since the logger started
        self.eval_s, self.evals = 0.0, 0
        # The ETA's origin: the end of the first step logged. That step compiles the rollout and
        # train programs (the tiny demo on a loaded 2-core machine: 113 s, then 15 s for step 2),
        # so counting it over the run predicted 9.5 min for a 2-min run.
        self.warm: tuple[int, float, float] | None = None  # (step, time, eval_s) then
        if not write:
            return
        self.backends = [TensorBoard(out_dir, config)]
        if wandb != "off":
            self.backends.append(Wandb(out_dir, mode=wandb, project=wandb_project, config=config))
        path = os.path.join(out_dir, "metrics.jsonl")
        # Resumed: the steps after the checkpoint are redone; fresh: all (step 0 included).
        keep_steps_until(path, start if start else -1)
        self.jsonl = open(path, "a")

    @classmethod
    def for_run(cls, cfg, *, start: int, total_steps: int | None = None) -> "MetricLogger":
        """The logger of a run's config (`RunConfig`): process 0 writes; `total_steps` default `steps`."""
        import jax
        return cls(cfg.out_dir, total_steps=cfg.steps if total_steps is None else total_steps, start=start, write=jax.process_index() == 0,
                   eval_every=cfg.eval.every, config=cfg.to_dict(), wandb=cfg.logging.wandb,
                   wandb_project=cfg.logging.wandb_project)

    def log(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        scalars = {k: v for k, v in metrics.items() if k != "step" and isinstance(v, (int, float))}
        for backend in self.backends:
            backend.scalars(step, scalars)
        # the wall clock since this process's logger started: steps per hour from the log alone
        self.jsonl.write(json.dumps({**metrics, "time/elapsed_s": round(time.perf_counter() - self.t0, 3)}) + "\n")
        self.jsonl.flush()
        if "time/eval_s" in metrics:
            self.eval_s, self.evals = self.eval_s + metrics["time/eval_s"], self.evals + 1
        now = self.clock()
        if self.warm is None and step > self.start:
            self.warm = (step, now, self.eval_s)
        if self.warm is None or (step == self.warm[0] and step < self.total):
            eta_text = "eta after step " + str((self.warm or (self.start,))[0] + 1)  # nothing measured yet
        else:
            first, since, eval_before = self.warm
            eta, unknown = eta_s(step=step, total=self.total, start=first, elapsed_s=now - since,
                                 eval_s=self.eval_s - eval_before, evals=self.evals, eval_every=self.eval_every,
                                 eval_total_s=self.eval_s)
            eta_text = f"eta {duration(eta)}" + (f" + {unknown} eval{'s' if unknown > 1 else ''}" if unknown else "")
        bar = "#" * int(20 * step / max(self.total, 1))
        labels = {"rollout/reward": "reward", "rollout/success": "success", "train/entropy": "entropy"}
        shown = "  ".join(f"{label} {metrics[k]:.3f}" for k, label in labels.items() if k in metrics)
        arm = f"  arm {metrics['feedback/arm']}" if "feedback/arm" in metrics else ""
        print(f"\r[{bar:<20}] step {step}/{self.total}  {shown}{arm}{eval_line(metrics)}{time_split(metrics)}"
              f"  {eta_text}", file=self.stream, flush=True)

    def close(self, history: list[dict]) -> None:
        if not self.enabled:
            return
        for backend in self.backends:
            backend.close()
        self.jsonl.close()
        if history:
            plot_curves(history, os.path.join(self.out_dir, "curves.png"))


def time_split(metrics: dict) -> str:
    """"  rollout 12.3s (idle 41%) / train 4.1s": where a step's time went, for a step row
    (the rollouts' accelerator idle share where the workload measured it)."""
    if "time/rollout_s" not in metrics or "time/train_s" not in metrics:
        return ""
    idle = metrics.get("time/rollout_idle_share")
    idle_text = f" (idle {idle:.0%})" if isinstance(idle, (int, float)) else ""
    return f"  rollout {metrics['time/rollout_s']:.1f}s{idle_text} / train {metrics['time/train_s']:.1f}s"


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
