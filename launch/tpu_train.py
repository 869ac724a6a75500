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
        print(f"\n{summary_line(hist, cfg.out_dir)}")


def summary_line(history: list[dict], out_dir: str) -> str:
    """The run's last line: the step reached, the last train reward (SFT: loss), the headline
    eval metrics and the eval reward from the first evaluation to the last (a fresh run's first
    is before training: what was learned), and where the curves and results are."""
    from jaxscaffold.train.logger import headline_keys
    last = history[-1]
    # RL reports the train reward, SFT (no rollouts) its loss
    trained = (f"last train reward {last['rollout/reward']:.3f}" if "rollout/reward" in last
               else f"last train loss {last.get('train/loss', float('nan')):.3f}")
    keys = headline_keys({k: 0 for h in history for k in h})
    if len(keys) == 2 and keys[0] == "eval/score":  # one env: its success is the score
        keys = keys[1:]
    evaluated = [h for h in history if keys and keys[0] in h]
    parts = []
    for key in keys + ["eval/reward"]:
        values = [h[key] for h in evaluated if key in h]
        if values:
            label = key[len("eval/"):].replace("success_", "success on ")
            parts.append(f"{label} {values[0]:.3f} -> {values[-1]:.3f}" if len(values) > 1 else f"{label} {values[0]:.3f}")
    steps = f" (step {evaluated[0]['step']} -> {evaluated[-1]['step']})" if len(evaluated) > 1 else ""
    evals = f"; eval{steps}: {', '.join(parts)}" if parts else ""
    return (f"[done] step {last['step']}; {trained}{evals}; curves in {os.path.join(out_dir, 'curves.png')}, "
            f"eval peaks and finals in {os.path.join(out_dir, 'results.json')}")


if __name__ == "__main__":
    main(sys.argv[1:])
