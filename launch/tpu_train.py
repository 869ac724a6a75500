"""Trains an agent: `python launch/tpu_train.py --config fee.py [--config.rl.lr=1e-6 ...]`.

The same entry point on a laptop CPU, a GPU and a TPU pod: configs are found by name in
`configs/` or by path; `--config.<field>=<value>` overrides a field (parsed as its type). The
config is checked before anything is built (`jaxscaffold.config`): a bad field or value is one
line naming it and what it allows, exit code 2. Multi-host pods start JAX's multi-controller
runtime (`jax.distributed`) automatically.
"""

from __future__ import annotations

import logging
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from jaxscaffold import config as config_lib  # noqa: E402

USAGE = "usage: python launch/tpu_train.py --config NAME_OR_PATH [--config.FIELD=VALUE ...]"


def config_path(value: str) -> str:
    """A config file: a path, or a file of `configs/` by name (".py" optional)."""
    for path in (value, os.path.join(ROOT, "configs", value), os.path.join(ROOT, "configs", value + ".py")):
        if os.path.isfile(path):
            return path
    names = sorted(f for f in os.listdir(os.path.join(ROOT, "configs")) if f.endswith(".py"))
    raise config_lib.ConfigError(f"no config {value!r} (not a file, not in configs/: {', '.join(names)})")


def parse_args(argv: list[str]) -> config_lib.RunConfig:
    """`--config NAME` (or `--config=NAME`) and `--config.a.b=v` overrides -> the checked config."""
    name, overrides = None, []
    args = iter(argv)
    for arg in args:
        if arg == "--config":
            name = next(args, None)
        elif arg.startswith("--config="):
            name = arg[len("--config="):]
        elif arg.startswith("--config."):
            item = arg[len("--config."):]
            if "=" not in item:  # `--config.steps 10`
                item += "=" + (next(args, None) or "")
            overrides.append(item)
        else:
            raise config_lib.ConfigError(f"unexpected argument {arg!r}; {USAGE}")
    if not name:
        raise config_lib.ConfigError(f"--config is required, e.g. --config tiny.py; {USAGE}")
    cd = config_lib.load_file(config_path(name))
    return config_lib.from_configdict(config_lib.parse_overrides(cd, overrides))


def main(argv: list[str]) -> None:
    try:
        cfg = parse_args(argv)
    except config_lib.ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if cfg.job == "rl":  # task RL on environments (FEE, the standard baseline, RWML's stage 2)
        from jaxscaffold.train.loop import train
    else:  # world-model RL (RWML's stage 1)
        from jaxscaffold.train.rwml import train_world_model as train
    result = train(cfg)
    hist = result["history"]
    if hist:
        last = hist[-1]
        print(f"\n[done] {len(hist)} steps; last train reward {last.get('rollout/reward', float('nan')):.3f}; "
              f"curves in {os.path.join(cfg.out_dir, 'curves.png')}")


if __name__ == "__main__":
    main(sys.argv[1:])
