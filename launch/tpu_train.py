"""Trains an agent: `python launch/tpu_train.py --config fee.py [--config.rl.lr=1e-6 ...]`.

The same entry point on a laptop CPU, a GPU and a TPU pod: configs are found by name in
`configs/` or by path (`file.py:variant` picks a named variant); `--config.<field>=<value>`
overrides a field (ml_collections' config flags, parsed as its type); `--help` lists every field
as declared. The config is checked before anything is built (`jaxscaffold.config`, and
`train.config_checks` for the names other modules define): a bad field or value is one line
naming it and what it allows, exit code 2 (bad input found once the run starts, e.g. an
unreadable task file or checkpoint, likewise). A run that stops because it cannot train (no
episode trains, non-finite updates) or cannot save is one line naming the cause and the last
checkpoint, exit code 1. Multi-host pods start JAX's multi-controller
runtime (`jax.distributed`) automatically.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from jaxscaffold import config as config_lib  # noqa: E402

USAGE = "usage: python launch/tpu_train.py --config NAME_OR_PATH[:VARIANT] [--config.FIELD=VALUE ...] [--help]"
def parse_args(argv: list[str]) -> config_lib.RunConfig:
    """`--config NAME [--config.a.b=v ...] [--help]` -> the checked config (ConfigError if bad)."""
    cfg, rest, show_help = config_lib.from_command_line(argv, os.path.join(ROOT, "configs"))
    if cfg is not None:
        from jaxscaffold.train.config_checks import check
        check(cfg)  # the names other modules define (presets, envs, feedback forms...)
    if rest:
        raise config_lib.ConfigError(f"unexpected argument {rest[0]!r}; {USAGE}")
    if show_help:
        if cfg is None:
            print(f"{__doc__}\n{USAGE}\n\nThe fields, at their declared defaults (--config NAME --help: its values):\n"
                  f"{config_lib.describe(config_lib.from_configdict(config_lib.defaults()))}")
        else:
            print(f"{USAGE}\n\nThe fields (with the overrides given):\n{config_lib.describe(cfg)}")
        sys.exit(0)
    if cfg is None:
        raise config_lib.ConfigError(f"--config is required, e.g. --config tiny.py; {USAGE}")
    return cfg


def user_errors() -> tuple[type[Exception], ...]:
    """The project's errors that mean bad input, not a bug: a refused resume, no readable
    checkpoint, an unloadable model directory or safetensors file, an unreadable task source,
    an env's missing dependency, a run that does not fit its devices' memory."""
    from jaxscaffold.envs.registry import MissingEnvDependency
    from jaxscaffold.models.hf_io import CheckpointError
    from jaxscaffold.models.safetensors_io import SafetensorsError
    from jaxscaffold.train.checkpoint import CheckpointCorrupt
    from jaxscaffold.train.memory_check import PlanDoesNotFit
    from jaxscaffold.train.tasks import TaskSourceError
    return (config_lib.ConfigError, CheckpointCorrupt, CheckpointError, SafetensorsError, TaskSourceError,
            MissingEnvDependency, PlanDoesNotFit)


def main(argv: list[str]) -> None:
    try:
        cfg = parse_args(argv)
    except config_lib.ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    from jaxscaffold.train.startup import configure_logging
    configure_logging(cfg.logging.verbose)  # before the libraries load: third-party INFO only when asked
    from jaxscaffold.train.failures import RunFailed
    from jaxscaffold.train.trainer import train  # runs the workload of cfg.job
    try:
        result = train(cfg)
    except user_errors() as e:  # bad input found once the run starts: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except RunFailed as e:  # the run could not train or save: one line, and a failed exit
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    hist = result["history"]
    if hist:
        last = hist[-1]
        # RL reports the train reward, SFT (no rollouts) its loss
        trained = (f"last train reward {last['rollout/reward']:.3f}" if "rollout/reward" in last
                   else f"last train loss {last.get('train/loss', float('nan')):.3f}")
        print(f"\n[done] step {last['step']}; {trained}; "
              f"curves in {os.path.join(cfg.out_dir, 'curves.png')}, eval peaks and finals in "
              f"{os.path.join(cfg.out_dir, 'results.json')}")


if __name__ == "__main__":
    main(sys.argv[1:])
