"""A study: a grid of arms (a config file and overrides each) x seeds, run one after another,
resumably, optionally split over processes or hosts (`shard`), then summarised (`report`).

A study file is Python with `get_study()` returning a dict:

    {"name": "fee_rooms", "out_dir": "runs/studies/fee_rooms", "seeds": [0, 1, 2, 3, 4],
     "score": "eval/score",            # the eval metric whose peak and final are compared
     "baseline": "standard",           # paired differences are taken against this arm
     "arms": {"standard": ("rooms.py", ["feedback.schedule=none"]),
              "fee": ("rooms.py", ["feedback.schedule=ag_early_oe_late"])},
     "primary": "final",               # the primary metric (see METRICS)
     "contrasts": [{"a": "fee", "b": "standard", "metric": "final", "hypothesis": "fee > standard"},
                   {"a": "fee", "b": "standard", "metric": "score", "step": 10, "exploratory": True}],
     "base": {"path": "runs/base", "commands": [["experiments/rooms_fee/base.py", "runs/base", "--seed", "0"]],
              "recipe": "what the commands do, in words"}}

Contrasts (any arm against any arm, on a metric of METRICS, "score" at a given step) and the
primary metric are declared before the study runs; the report gives each its paired figures
and Holm-adjusted p-values over the confirmatory ones (without contrasts: every arm against
the baseline on the primary metric). `base`: the commands (run with this Python from the
repository root) that build the shared base model at `path` when it is missing (`ensure_base`).

Each run trains in `out_dir/ARM/seed_S` (its own checkpoints and logs: an interrupted run
resumes there) and, once finished, leaves `run.json` (its history), so rerunning the study
skips it. Every run's config is checked before the first one starts.

Two stages (RWML's world model, then policy RL from it): an arm `(config, overrides, then)`
with `then = (config, overrides)` first trains its own config in `out_dir/ARM/seed_S/stage1`
(leaving `stage1/run.json`, so a study resumed after it skips it), then `then`, with the same
seed, in `out_dir/ARM/seed_S`, starting from stage 1's HF export (`model.hf_path`: stage 1's
`rwml.export_dir`, or `export.dir` with `export.at_end`; default `stage1/hf`). The arm's scores
are the second stage's; `run.json` keeps the first stage's history too (`stage1_history`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import resource
import subprocess
import sys
import time
from typing import Callable, Mapping, Sequence

from jaxscaffold import config as config_lib
from jaxscaffold.train import config_checks

log = logging.getLogger(__name__)
RUN_FILE = "run.json"
STAGE1_DIR = "stage1"  # a two-stage run's first stage, inside the run's directory


@dataclasses.dataclass(frozen=True)
class Study:
    name: str
    out_dir: str
    seeds: tuple[int, ...]
    arms: Mapping[str, tuple[str, tuple[str, ...]]]  # arm -> (config file, overrides "a.b=v")
    score: str = "eval/score"
    baseline: str | None = None
    then: Mapping[str, tuple[str, tuple[str, ...]]] = dataclasses.field(default_factory=dict)  # arm -> its 2nd stage
    primary: str = "final"  # the primary metric (declared before the run)
    contrasts: tuple[Contrast, ...] = ()  # declared before the run; Holm adjusts over the confirmatory ones
    base: Mapping[str, object] = dataclasses.field(default_factory=dict)  # how its base model is made (`base`)

    def runs(self) -> list[tuple[str, int]]:
        """Every (arm, seed), seed-major: a partial study has every arm at its first seeds."""
        return [(arm, seed) for seed in self.seeds for arm in self.arms]

    def run_dir(self, arm: str, seed: int) -> str:
        return os.path.join(self.out_dir, arm, f"seed_{seed}")


# A contrast's metric: a figure of `stats.summarise_run` ("score" is the eval score at `step`).
METRICS = ("final", "peak", "auc", "eval_variability", "score", "reward_variability", "informative_share",
           "first_informative_step")


@dataclasses.dataclass(frozen=True)
class Contrast:
    """Arm a - arm b on one metric over shared seeds. `exploratory`: reported, but outside the
    Holm family (chosen after a run, or not a hypothesis); `hypothesis`: the expected
    direction in words, for the record."""

    a: str
    b: str
    metric: str
    step: int | None = None
    exploratory: bool = False
    hypothesis: str = ""

    @property
    def name(self) -> str:
        what = f"score@{self.step}" if self.metric == "score" else self.metric
        return f"{self.a} - {self.b}: {what}"


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
    unknown = set(d) - {f.name for f in dataclasses.fields(Study)} - {"then"}  # `then` lives in the arms
    if missing or unknown:
        raise StudyError(f"{path}: missing {sorted(missing)}, unknown {sorted(unknown)}")
    if not d["arms"] or not d["seeds"]:
        raise StudyError(f"{path}: a study needs at least one arm and one seed")
    arms, then = {}, {}
    for arm, value in d["arms"].items():
        stages = [value[:2], value[2]] if isinstance(value, (tuple, list)) and len(value) == 3 else [value]
        if not all(isinstance(v, (tuple, list)) and len(v) == 2 and isinstance(v[0], str) for v in stages):
            raise StudyError(f"{path}: arm {arm!r} must be (config file, [overrides]) or "
                             "(config file, [overrides], (then config file, [overrides]))")
        arms[str(arm)] = (stages[0][0], tuple(stages[0][1]))
        if len(stages) == 2:
            then[str(arm)] = (stages[1][0], tuple(stages[1][1]))
    if d.get("baseline") is not None and d["baseline"] not in arms:
        raise StudyError(f"{path}: baseline {d['baseline']!r} is not an arm ({', '.join(arms)})")
    primary = d.get("primary", "final")
    if primary not in METRICS:
        raise StudyError(f"{path}: primary {primary!r} is not one of {METRICS}")
    contrasts = tuple(_contrast(path, c, arms) for c in d.get("contrasts", ()))
    base = dict(d.get("base") or {})
    commands = base.get("commands")
    if base and (not isinstance(base.get("path"), str) or not isinstance(commands, (list, tuple)) or not commands
                 or not all(isinstance(c, (list, tuple)) and c and all(isinstance(x, str) for x in c)
                            for c in commands)):
        raise StudyError(f"{path}: base needs 'path' (the model directory) and 'commands' (argv lists of "
                         "Python scripts, run from the repository root, that build it)")
    return Study(d["name"], d["out_dir"], tuple(int(s) for s in d["seeds"]), arms, d.get("score", "eval/score"),
                 d.get("baseline"), then, primary, contrasts, base)


def _contrast(path: str, c, arms) -> Contrast:
    if not isinstance(c, dict) or not {"a", "b", "metric"} <= set(c):
        raise StudyError(f"{path}: a contrast is a dict with 'a', 'b', 'metric' (and 'step', 'exploratory', "
                         f"'hypothesis'), got {c!r}")
    unknown = set(c) - {f.name for f in dataclasses.fields(Contrast)}
    if unknown:
        raise StudyError(f"{path}: contrast {c!r}: unknown keys {sorted(unknown)}")
    for side in ("a", "b"):
        if c[side] not in arms:
            raise StudyError(f"{path}: contrast {c!r}: {c[side]!r} is not an arm ({', '.join(arms)})")
    if c["metric"] not in METRICS:
        raise StudyError(f"{path}: contrast {c!r}: metric {c['metric']!r} is not one of {METRICS}")
    if (c["metric"] == "score") != (c.get("step") is not None):
        raise StudyError(f"{path}: contrast {c!r}: metric 'score' needs a 'step', other metrics none")
    return Contrast(c["a"], c["b"], c["metric"], None if c.get("step") is None else int(c["step"]),
                    bool(c.get("exploratory", False)), str(c.get("hypothesis", "")))


def _checked(arm: str, stage: tuple[str, tuple[str, ...]], extra: list[str], configs_dir: str):
    path, overrides = stage
    cd = config_lib.load_file(config_lib.config_path(path, configs_dir))
    try:
        return config_checks.checked(config_lib.parse_overrides(cd, [*overrides, *extra]))
    except config_lib.ConfigError as e:
        raise config_lib.ConfigError(f"arm {arm}: {e}") from None


def run_config(study: Study, arm: str, seed: int, configs_dir: str) -> config_lib.RunConfig:
    """The checked config of one run: the arm's file and overrides, the seed and its directory
    (a two-stage arm: its first stage, in `stage1/`)."""
    out = study.run_dir(arm, seed)
    if arm in study.then:
        out = os.path.join(out, STAGE1_DIR)
    return _checked(arm, study.arms[arm], [f"seed={seed}", f"out_dir={out}"], configs_dir)


def export_dir(cfg: config_lib.RunConfig) -> str:
    """Where a run writes its HF export (what a second stage starts from); StudyError if none."""
    if cfg.job == "rwml":
        return cfg.rwml.export_dir or os.path.join(cfg.out_dir, "hf")
    if cfg.export.at_end:
        return cfg.export.dir or os.path.join(cfg.out_dir, "hf")
    raise StudyError(f"{cfg.out_dir}: a first stage must export its model (job=rwml, or export.at_end=true)")


def stage_configs(study: Study, arm: str, seed: int, configs_dir: str) -> list[config_lib.RunConfig]:
    """The checked configs of one run's stages, in order: one, or two where the second starts
    from the first's export (same seed)."""
    first = run_config(study, arm, seed, configs_dir)
    if arm not in study.then:
        return [first]
    extra = [f"seed={seed}", f"out_dir={study.run_dir(arm, seed)}", f"model.hf_path={export_dir(first)}"]
    return [first, _checked(arm, study.then[arm], extra, configs_dir)]


def finished(study: Study, arm: str, seed: int) -> dict | None:
    """A finished run's record (arm, seed, history), or None."""
    path = os.path.join(study.run_dir(arm, seed), RUN_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def default_train(cfg: config_lib.RunConfig) -> list[dict]:
    """Trains one run as the launcher does (the workload of its job) and returns its history."""
    from jaxscaffold.train.trainer import train
    return train(cfg)["history"]


def run_study(study: Study, configs_dir: str, *, shard: tuple[int, int] = (0, 1),
              train: Callable[[config_lib.RunConfig], Sequence[dict]] = default_train) -> list[tuple[str, int]]:
    """Runs this shard's unfinished runs (run i belongs to shard i % n); returns those it ran."""
    index, count = shard
    if not 0 <= index < count:
        raise StudyError(f"shard {index}/{count}: expected 0 <= i < n")
    mine = [r for i, r in enumerate(study.runs()) if i % count == index]
    configs = {r: stage_configs(study, *r, configs_dir) for r in mine}  # every config checked first
    ran = []
    for arm, seed in mine:
        if finished(study, arm, seed) is not None:
            log.info("study %s: %s seed %d already finished", study.name, arm, seed)
            continue
        *firsts, last = configs[(arm, seed)]
        record, started = {"arm": arm, "seed": seed}, time.monotonic()
        for cfg in firsts:  # a two-stage arm's first stage, unless it finished before
            path = os.path.join(cfg.out_dir, RUN_FILE)
            if os.path.exists(path):
                with open(path) as f:
                    record["stage1_history"] = json.load(f)["history"]
                continue
            log.info("study %s: running %s seed %d, stage 1", study.name, arm, seed)
            record["stage1_history"] = list(train(cfg))
            _write_record(path, {"arm": arm, "seed": seed, "history": record["stage1_history"]})
        log.info("study %s: running %s seed %d", study.name, arm, seed)
        record["history"] = list(train(last))
        _write_record(os.path.join(study.run_dir(arm, seed), RUN_FILE), record)
        ran.append((arm, seed))
        # Runs share one process: its peak memory, logged per run, shows whether runs accumulate
        # (a shard of the second RWML rooms run grew to 13 GB over 8 runs and was OOM-killed).
        log.info("study %s: %s seed %d finished in %.0f s; process peak resident %.2f GB",
                 study.name, arm, seed, time.monotonic() - started, peak_resident_gb())
    return ran


def peak_resident_gb() -> float:
    """This process's peak resident memory so far, GB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def base_missing(study: Study) -> bool:
    """Whether the study names a base model that is not there yet (no config.json at its path)."""
    return bool(study.base) and not os.path.isfile(os.path.join(study.base["path"], "config.json"))


def ensure_base(study: Study, root: str, *, build: bool = True, say: Callable[[str], None] = print) -> bool:
    """Builds the study's base model by its seeded commands when it is missing (each run as
    `python ROOT/ARGV[0] ARGV[1:]...` in this directory, where the study's paths are read;
    their output passes through); True if it built one.
    `build=False`: a missing base is a StudyError naming the commands."""
    if not base_missing(study):
        return False
    commands = [[sys.executable, os.path.join(root, c[0]), *c[1:]] for c in study.base["commands"]]
    shown = " && ".join("python " + " ".join(c) for c in study.base["commands"])
    if not build:
        raise StudyError(f"study {study.name}: no base model at {study.base['path']}; build it with: {shown}")
    say(f"study {study.name}: no base model at {study.base['path']}; building it ({study.base.get('recipe', '')}): "
        f"{shown}")
    for argv in commands:
        done = subprocess.run(argv, check=False)  # a failure is reported below, in one line
        if done.returncode != 0:
            raise StudyError(f"study {study.name}: building the base failed (exit {done.returncode}): "
                             f"python {' '.join(argv[1:])}")
    if base_missing(study):
        raise StudyError(f"study {study.name}: the base commands ran but left no config.json in {study.base['path']}")
    return True


def _write_record(path: str, record: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)  # atomic: a killed study never leaves half a record
