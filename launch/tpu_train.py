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

USAGE = "usage: python launch/tpu_train.py --config NAME_OR_PATH [--config.FIELD=VALUE ...] [--help]"
# The files that declare the fields, and the prefix of their sections there (the comment on each
# field's line is its documentation; the other config files only override values).
FIELD_FILES = {"base.py": "c.", "rwml.py": "w."}


def field_comments() -> dict[str, str]:
    """{"rl.lr": "AdamW learning rate ...", ...} from the declaring config files' comments."""
    import re
    out = {}
    for name, prefix in FIELD_FILES.items():
        section = "" if prefix == "c." else "rwml."
        pattern = re.compile(rf"^\s*{re.escape(prefix)}([\w.]+)\s*=.*?#\s*(.+)$")
        for line in open(os.path.join(ROOT, "configs", name)):
            m = pattern.match(line)
            if m:
                out[section + m.group(1)] = m.group(2).strip()
    return out


def describe(cfg: config_lib.RunConfig) -> str:
    """Every field of `cfg`: its dotted name, current value and comment."""
    comments = field_comments()
    lines = []

    def walk(d: dict, where: str) -> None:
        for key, value in d.items():
            if isinstance(value, dict):
                walk(value, f"{where}{key}.")
            else:
                lines.append(f"  --config.{where}{key}={value!r}  # {comments.get(where + key, '')}".rstrip(" #"))
    walk(cfg.to_dict(), "")
    return "\n".join(lines)


def config_path(value: str) -> str:
    """A config file: a path, or a file of `configs/` by name (".py" optional)."""
    for path in (value, os.path.join(ROOT, "configs", value), os.path.join(ROOT, "configs", value + ".py")):
        if os.path.isfile(path):
            return path
    names = sorted(f for f in os.listdir(os.path.join(ROOT, "configs")) if f.endswith(".py"))
    raise config_lib.ConfigError(f"no config {value!r} (not a file, not in configs/: {', '.join(names)})")


def parse_args(argv: list[str]) -> config_lib.RunConfig:
    """`--config NAME` (or `--config=NAME`) and `--config.a.b=v` overrides -> the checked config."""
    name, overrides, show_help = None, [], False
    args = iter(argv)
    for arg in args:
        if arg in ("--help", "-h"):
            show_help = True
        elif arg == "--config":
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
        if show_help:
            print(__doc__ + "\n" + USAGE)
            sys.exit(0)
        raise config_lib.ConfigError(f"--config is required, e.g. --config tiny.py; {USAGE}")
    cd = config_lib.load_file(config_path(name))
    cfg = config_lib.from_configdict(config_lib.parse_overrides(cd, overrides))
    if show_help:
        print(f"{USAGE}\n\nThe fields of {name} (with the overrides given):\n{describe(cfg)}")
        sys.exit(0)
    return cfg


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
