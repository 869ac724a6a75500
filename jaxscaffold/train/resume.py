"""What a run records of its config, and what resuming it may change.

`out_dir/config.json` holds the resolved config of the run's latest start (`write_config`).
Starting again in an out_dir with checkpoints resumes it; `check_resume` first compares the
new config with the recorded one field by field and refuses, in one line naming each changed
field old -> new, unless `checkpoint.allow_change` lists them. It runs before the model is
built, so a refused change costs nothing. A run already at its end (`finished_checkpoint`)
is not rebuilt at all.
"""

from __future__ import annotations

import json
import os
from typing import Any

from jaxscaffold import config as config_lib
from jaxscaffold.config import ConfigError, RunConfig
from jaxscaffold.train import checkpoint
from jaxscaffold.train.checkpoint import PARAMS_DIR, saved_steps

CONFIG_FILE = "config.json"

# Fields that only say how the run executes or reports, never what it computes: they change
# freely (a longer run, more env workers, another mesh: the checkpoint restores onto any
# sharding). A name ending in "." is a section.
FREE = ("out_dir", "steps", "mesh.", "envs.num_workers", "envs.step_timeout_s", "checkpoint.", "logging.", "memory.",
        "eval.every", "eval.at_start", "export.",  # how often the model is evaluated changes no training
        "rl.max_bad_steps", "rl.max_empty_steps")  # when a failing run stops
# Fields that decide the parameters' shapes: a checkpoint cannot be restored under others.
FIXED = ("job", "model.hf_path", "model.preset", "lora.rank", "lora.targets")  # LoRA: the adapters' shapes


def write_config(cfg: RunConfig) -> str:
    """Writes `cfg` (resolved: every field, typed) to out_dir/config.json, atomically."""
    path = os.path.join(cfg.out_dir, CONFIG_FILE)
    os.makedirs(cfg.out_dir, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(cfg.to_dict(), f, indent=2)
    os.replace(path + ".tmp", path)
    return path


def read_config(out_dir: str) -> dict | None:
    """out_dir/config.json's fields (a dict), or None when the run recorded none."""
    path = os.path.join(out_dir, CONFIG_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path} is unreadable ({e}): repair or delete it to resume") from None


def changed_fields(old: dict, new: dict) -> dict[str, tuple[Any, Any]]:
    """{dotted field: (old, new)} of the fields both configs have and that differ (a field
    added or removed since is not a change: the code, not the run, changed)."""
    a, b = config_lib.flat_fields(old), config_lib.flat_fields(new)
    return {k: (a[k], b[k]) for k in a if k in b and a[k] != b[k]}


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(name == p or (p.endswith(".") and name.startswith(p)) for p in patterns)


def check_resume(cfg: RunConfig) -> dict[str, tuple[Any, Any]]:
    """Refuses (ConfigError, one line) to resume the run in `cfg.out_dir` under a config that
    changes a field the run depends on, unless `checkpoint.allow_change` lists it; never when
    the field fixes the model's shape; and from params-only checkpoints alone (no optimizer
    state). Returns the allowed changes ({} for a fresh run)."""
    params_only = saved_steps(os.path.join(cfg.out_dir, PARAMS_DIR))
    if params_only and not saved_steps(os.path.join(cfg.out_dir, "checkpoints")):
        raise ConfigError(f"resuming {cfg.out_dir}: it has params-only checkpoints (steps {params_only}) and no full "
                          "one; they hold no optimizer state, so a run cannot resume from them (export or evaluate "
                          "them: launch/export_hf.py / eval.py --checkpoint); use a new out_dir")
    old = read_config(cfg.out_dir)
    if old is None or not saved_steps(os.path.join(cfg.out_dir, "checkpoints")):
        return {}  # a fresh run (or one from before config.json was written)
    changes = {k: v for k, v in changed_fields(old, cfg.to_dict()).items() if not _matches(k, FREE)}
    where = os.path.join(cfg.out_dir, CONFIG_FILE)
    fixed = [k for k in changes if _matches(k, FIXED)]
    if fixed:
        raise ConfigError(f"resuming {cfg.out_dir}: {_describe(changes, fixed)} cannot change (its checkpoints "
                          f"hold that model's parameters, {where}); use a new out_dir")
    refused = [k for k in changes if k not in cfg.checkpoint.allowed_changes()]
    if refused:
        allow = ",".join(sorted({*cfg.checkpoint.allowed_changes(), *refused}))
        raise ConfigError(f"resuming {cfg.out_dir} changes {_describe(changes, refused)} (vs {where}); if "
                          f"intended, pass --config.checkpoint.allow_change={allow} (else use a new out_dir)")
    return changes


def finished_checkpoint(cfg: RunConfig, required: tuple[str, ...]) -> dict | None:
    """The JSON document of the newest checkpoint of the run in `cfg.out_dir` when the run has
    nothing left to train: that step is intact (its manifest verifies, its JSON holds
    `required` and `total_steps`) and at or past both `cfg.steps` and the length the run last
    trained to (a workload may set its own: RWML's epochs). None otherwise: the ordinary resume
    restores the run (or falls back past a damaged step). Hashes the step's files as a restore
    does, but decodes no array and builds no model."""
    steps = saved_steps(os.path.join(cfg.out_dir, "checkpoints"))
    if not steps or steps[-1] < cfg.steps:
        return None
    directory = os.path.join(cfg.out_dir, "checkpoints", str(steps[-1]))
    if not os.path.exists(os.path.join(directory, checkpoint.MANIFEST)):
        return None  # unverifiable here: the ordinary resume decides
    ckpt = checkpoint.Checkpointer(os.path.join(cfg.out_dir, "checkpoints"), async_save=False, reader=True)
    try:
        checkpoint.verify_manifest(directory)
        extra = ckpt.restore_extra(steps[-1])
    except Exception:  # noqa: BLE001  a damaged step: the ordinary resume reports and skips it
        return None
    finally:
        ckpt.close()
    if not isinstance(extra, dict) or not {*required, "total_steps"} <= set(extra):
        return None
    return extra if extra["step"] >= max(cfg.steps, extra["total_steps"]) else None


def _describe(changes: dict, names: list[str]) -> str:
    return ", ".join(f"{k} {changes[k][0]!r} -> {changes[k][1]!r}" for k in names)
