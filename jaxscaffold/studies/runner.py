"""A study: a grid of arms (a config file and overrides each) x seeds, run one after another,
resumably, optionally split over processes or hosts (`shard`), then summarised (`report`).

A study file is Python with `get_study()` returning a dict:

    {"name": "fee_rooms", "out_dir": "runs/studies/fee_rooms", "seeds": [0, 1, 2, 3, 4],
     "score": "eval/score",            # the eval metric whose peak and final are compared
     "baseline": "standard",           # paired differences are taken against this arm
     "arms": {"standard": ("rooms.py", ["feedback.schedule=none"]),
              "fee": ("rooms.py", ["feedback.schedule=ag_early_oe_late"])}}

Each run trains in `out_dir/ARM/seed_S` (its own checkpoints and logs: an interrupted run
resumes there) and, once finished, leaves `run.json` (its history), so rerunning the study
skips it. Every run's config is checked before the first one starts.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
from typing import Callable, Mapping, Sequence

from jaxscaffold import config as config_lib

log = logging.getLogger(__name__)
RUN_FILE = "run.json"


@dataclasses.dataclass(frozen=True)
class Study:
    name: str
    out_dir: str
    seeds: tuple[int, ...]
    arms: Mapping[str, tuple[str, tuple[str, ...]]]  # arm -> (config file, overrides "a.b=v")
    score: str = "eval/score"
    baseline: str | None = None

    def runs(self) -> list[tuple[str, int]]:
        """Every (arm, seed), seed-major: a partial study has every arm at its first seeds."""
        return [(arm, seed) for seed in self.seeds for arm in self.arms]

    def run_dir(self, arm: str, seed: int) -> str:
        return os.path.join(self.out_dir, arm, f"seed_{seed}")


class StudyError(ValueError):
    """A malformed study file; the message names the problem."""


def load_study(path: str) -> Study:
    """The checked Study of a study file."""
    if not os.path.isfile(path):
        raise StudyError(f"no study file {path}")
    spec = importlib.util.spec_from_file_location("jaxscaffold_study", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_study"):
        raise StudyError(f"{path} defines no get_study()")
    d = dict(module.get_study())
    missing = {"name", "out_dir", "seeds", "arms"} - set(d)
    unknown = set(d) - {f.name for f in dataclasses.fields(Study)}
    if missing or unknown:
        raise StudyError(f"{path}: missing {sorted(missing)}, unknown {sorted(unknown)}")
    if not d["arms"] or not d["seeds"]:
        raise StudyError(f"{path}: a study needs at least one arm and one seed")
    arms = {}
    for arm, value in d["arms"].items():
        if not (isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], str)):
            raise StudyError(f"{path}: arm {arm!r} must be (config file, [overrides])")
        arms[str(arm)] = (value[0], tuple(value[1]))
    if d.get("baseline") is not None and d["baseline"] not in arms:
        raise StudyError(f"{path}: baseline {d['baseline']!r} is not an arm ({', '.join(arms)})")
    return Study(d["name"], d["out_dir"], tuple(int(s) for s in d["seeds"]), arms, d.get("score", "eval/score"),
                 d.get("baseline"))


def run_config(study: Study, arm: str, seed: int, configs_dir: str) -> config_lib.RunConfig:
    """The checked config of one run: the arm's file and overrides, the seed and its directory."""
    path, overrides = study.arms[arm]
    cd = config_lib.load_file(config_lib.config_path(path, configs_dir))
    extra = [f"seed={seed}", f"out_dir={study.run_dir(arm, seed)}"]
    try:
        return config_lib.from_configdict(config_lib.parse_overrides(cd, [*overrides, *extra]))
    except config_lib.ConfigError as e:
        raise config_lib.ConfigError(f"arm {arm}: {e}") from None


def finished(study: Study, arm: str, seed: int) -> dict | None:
    """A finished run's record (arm, seed, history), or None."""
    path = os.path.join(study.run_dir(arm, seed), RUN_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def default_train(cfg: config_lib.RunConfig) -> list[dict]:
    """Trains one run as the launcher does (task RL, or world-model RL) and returns its history."""
    if cfg.job == "rl":
        from jaxscaffold.train.trainer import train
    else:
        from jaxscaffold.train.workloads.world_model import train_world_model as train
    return train(cfg)["history"]


def run_study(study: Study, configs_dir: str, *, shard: tuple[int, int] = (0, 1),
              train: Callable[[config_lib.RunConfig], Sequence[dict]] = default_train) -> list[tuple[str, int]]:
    """Runs this shard's unfinished runs (run i belongs to shard i % n); returns those it ran."""
    index, count = shard
    if not 0 <= index < count:
        raise StudyError(f"shard {index}/{count}: expected 0 <= i < n")
    mine = [r for i, r in enumerate(study.runs()) if i % count == index]
    configs = {r: run_config(study, *r, configs_dir) for r in mine}  # every config checked first
    ran = []
    for arm, seed in mine:
        if finished(study, arm, seed) is not None:
            log.info("study %s: %s seed %d already finished", study.name, arm, seed)
            continue
        log.info("study %s: running %s seed %d", study.name, arm, seed)
        history = list(train(configs[(arm, seed)]))
        record = {"arm": arm, "seed": seed, "history": history}
        path = os.path.join(study.run_dir(arm, seed), RUN_FILE)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)  # atomic: a killed study never leaves half a record
        ran.append((arm, seed))
    return ran
