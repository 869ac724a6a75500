"""Trains an agent: `python launch/tpu_train.py --config fee.py [--config.rl.lr=1e-6 ...]`.

The same entry point on a laptop CPU, a GPU and a TPU pod: configs are found by name in
`configs/` or by path; overrides use ml_collections' `--config.<field>=<value>` syntax.
Multi-host pods start JAX's multi-controller runtime (`jax.distributed`) automatically.
"""

from __future__ import annotations

import logging
import os
import sys

from absl import app
from ml_collections import config_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def resolve_config_arg(argv: list[str]) -> list[str]:
    """`--config NAME` (or `--config=NAME`): a path, or a file of `configs/` by name."""
    out = list(argv)
    for i, arg in enumerate(out):
        value = None
        if arg == "--config" and i + 1 < len(out):
            value, at = out[i + 1], i + 1
        elif arg.startswith("--config="):
            value, at = arg[len("--config="):], i
        if value is None:
            continue
        path = value if os.path.exists(value) else os.path.join(ROOT, "configs", value)
        if not path.endswith(".py") and not os.path.exists(path):
            path += ".py"
        if not os.path.exists(path):
            names = sorted(f for f in os.listdir(os.path.join(ROOT, "configs")) if f.endswith(".py"))
            sys.exit(f"error: no config {value!r} (not a file, not in configs/: {', '.join(names)})")
        out[at] = path if at == i + 1 else f"--config={path}"
        break
    return out


_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config (a name in configs/ or a path)")


def main(_):
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = _CONFIG.value
    if cfg is None:
        sys.exit("error: --config is required, e.g. --config tiny.py")
    job = cfg.get("job", "rl")
    if job == "rl":  # task RL on environments (FEE, the standard baseline, RWML's stage 2)
        from jaxscaffold.train.trainer import train
    elif job == "rwml":  # world-model RL (RWML's stage 1)
        from jaxscaffold.train.workloads.world_model import train_world_model as train
    else:
        sys.exit(f"error: unknown job {job!r} in the config (rl, rwml)")
    result = train(cfg)
    hist = result["history"]
    if hist:
        last = hist[-1]
        print(f"\n[done] {len(hist)} steps; last train reward {last.get('rollout/reward', float('nan')):.3f}; "
              f"curves in {os.path.join(cfg.out_dir, 'curves.png')}")


if __name__ == "__main__":
    sys.argv = resolve_config_arg(sys.argv)
    app.run(main)
