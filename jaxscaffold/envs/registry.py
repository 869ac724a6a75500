"""Environment names -> task catalogues and constructors, imported lazily so a missing
optional dependency only matters when its environment is used (and then says how to install)."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

from jaxscaffold.envs.base import Env, Task

# name: (module, catalogue function, env class, pip extra that provides its dependencies)
ENVS = {
    "letters": ("jaxscaffold.envs.letters", "catalogue", "LettersEnv", None),
    "sciworld": ("jaxscaffold.envs.sciworld", "catalogue", "ScienceWorldEnv", "envs"),
    "bfcl": ("jaxscaffold.envs.bfcl", "catalogue", "BFCLEnv", "envs"),
    "alfworld": ("jaxscaffold.envs.alfworld", "catalogue", "ALFWorldEnv", "envs"),
    "tau2": ("jaxscaffold.envs.tau2", "catalogue", "Tau2Env", "tau2"),
    "jsonl": ("jaxscaffold.envs.jsonl", "catalogue", "JsonlEnv", None),  # split = a .jsonl path
    "rooms": ("jaxscaffold.envs.rooms", "catalogue", "RoomsEnv", None),  # the CPU testbed for FEE
    "latency": ("jaxscaffold.envs.latency", "catalogue", "LatencyEnv", None),  # steps that sleep: the rollout benchmark's
}

# name: the splits its catalogue takes (listed here so a config is checked without importing
# the env; tests/envs check them against each module's own). tau2 also takes "<domain>/<split>".
SPLITS = {
    "letters": ("train", "test"),
    "sciworld": ("train", "test"),  # the FEE reference code's L0 lists
    "bfcl": ("train", "validation"),
    "alfworld": ("train", "valid_seen", "valid_unseen", "eval_in_distribution", "eval_out_of_distribution",
                 "in_distribution", "out_of_distribution"),
    "tau2": ("train", "test", "base"),
    "rooms": ("train", "test"),
    "latency": ("train", "test"),
}
TAU2_DOMAINS = ("retail", "airline", "telecom")
# ScienceWorld's levels and their splits ("L1/test"; a bare split is the default level L0's).
SCIWORLD_LEVEL_SPLITS = {"official": ("train", "dev", "test"), "L0": ("train", "test"), "L1": ("train", "test"),
                         "L2": ("train", "test")}


def register(name: str, module: str, env_class: str, *, catalogue: str = "catalogue",
             splits: tuple[str, ...] | None = None, extra: str | None = None,
             system_prompt: str | None = None) -> None:
    """Adds an environment from outside the package: `module` (importable, e.g. your own
    `mypkg.myenv`) defines `catalogue(split) -> [Task]` (each Task's `category`, if set, is what
    evaluation sets balance over and scores report by) and `env_class` (the Env protocol of
    `envs.base`). `splits`, if given, lets configs be checked before anything is imported;
    `extra` names the pip extra to suggest when the module's import fails; `system_prompt` is
    the agent's (else the env's reset observations carry theirs). A config file can call it
    before returning its config; pool workers construct the env from its import path."""
    if not name.isidentifier():
        raise ValueError(f"environment name {name!r} must be an identifier (it is a metric and task-spec key)")
    ENVS[name] = (module, catalogue, env_class, extra)
    if splits is not None:
        SPLITS[name] = tuple(splits)
    else:
        SPLITS.pop(name, None)
    if system_prompt is not None:
        from jaxscaffold.envs import prompts
        prompts.SYSTEM_PROMPTS[name] = system_prompt


def import_path(name: str) -> str:
    """"module:Class" of env `name` (what a pool worker imports to build it)."""
    if name not in ENVS:
        raise KeyError(f"unknown environment {name!r}; known: {sorted(ENVS)}")
    module, _, env_class, _ = ENVS[name]
    return f"{module}:{env_class}"


def check_split(name: str, split: str) -> None:
    """Raises ValueError (one line) unless env `name` has a split `split` (an env registered
    without its splits takes any; its catalogue says)."""
    if name not in ENVS:
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(ENVS)}")
    if name == "jsonl" and not split.endswith(".jsonl"):
        raise ValueError(f"jsonl's split is a path to a .jsonl file (jsonl:PATH[:N]), got {split!r}")
    if name not in SPLITS:
        return
    if name == "sciworld" and "/" in split:  # "L1/test": a level and its split
        level, split = split.split("/", 1)
        if level not in SCIWORLD_LEVEL_SPLITS:
            raise ValueError(f"sciworld has no level {level!r}; levels: {', '.join(SCIWORLD_LEVEL_SPLITS)}")
        if split not in SCIWORLD_LEVEL_SPLITS[level]:
            raise ValueError(f"sciworld level {level} has no split {split!r}; splits: "
                             f"{', '.join(SCIWORLD_LEVEL_SPLITS[level])}")
        return
    if name == "tau2" and "/" in split:
        domain, split = split.split("/", 1)
        if domain not in TAU2_DOMAINS:
            raise ValueError(f"tau2 has no domain {domain!r}; domains: {', '.join(TAU2_DOMAINS)}")
    if split not in SPLITS[name]:
        raise ValueError(f"{name} has no split {split!r}; splits: {', '.join(SPLITS[name])}")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One entry of a task spec: an env, its split ("" for the default) and a task count (None: the default)."""

    env: str
    split: str = ""
    limit: int | None = None


def parse_task_spec(spec: str) -> list[TaskSpec]:
    """"sciworld:train:4,bfcl" -> [TaskSpec("sciworld", "train", 4), TaskSpec("bfcl")]."""
    out = []
    for entry in [n.strip() for n in spec.split(",") if n.strip()]:
        parts = entry.split(":")
        if len(parts) > 3:
            raise ValueError(f"task spec entry {entry!r}: expected env, env:split or env:split:n")
        name, split, limit = (parts + ["", ""])[:3]
        try:
            n = int(limit) if limit.strip() else None
        except ValueError:
            raise ValueError(f"task spec entry {entry!r}: the task count {limit!r} is not an integer") from None
        out.append(TaskSpec(name.strip(), split.strip(), n))
    return out


class MissingEnvDependency(ImportError):
    pass


def _module(name: str):
    if name not in ENVS:
        raise KeyError(f"unknown environment {name!r}; known: {sorted(ENVS)}")
    module, _, _, extra = ENVS[name]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        hint = f"pip install -e '.[{extra}]'" if extra else "pip install -e ."
        raise MissingEnvDependency(f"environment {name!r} needs {e.name or e}: install it with `{hint}` "
                                   f"(or `bash launch/dev.sh test`, which installs every extra)") from e


def catalogue(name: str, split: str, **kwargs) -> list[Task]:
    return getattr(_module(name), ENVS[name][1])(split, **kwargs)


def factory(name: str, **kwargs) -> Callable[[], Env]:
    cls = getattr(_module(name), ENVS[name][2])
    return lambda: cls(**kwargs)
