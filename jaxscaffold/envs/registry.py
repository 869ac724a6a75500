"""Every environment's `EnvSpec`, by name: its module and class, catalogue, splits and what
else the package reads of it, declared once; the modules are imported lazily, so a missing
optional dependency only matters when its environment is used (and then says how to install).

Adding an environment: one module (catalogue + Env class) and one `register(EnvSpec(...))`."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, Mapping

from jaxscaffold.envs.base import Env, Task


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """Everything the package needs to know of an environment, declared once and read without
    importing it (so a missing optional dependency only matters when the env is used, and then
    says how to install it). Feedback's side of an env (its AG / OE forms, the unit its windows
    count, hooks run inside the env) is registered by feedback, keyed by the same name
    (`feedback.enrichers.FeedbackSpec`): envs know nothing of feedback.

    `module` (importable, e.g. your own `mypkg.myenv`) defines `catalogue(split) -> [Task]` (each
    Task's `category`, if set, is what evaluation sets balance over and scores report by) and
    `env_class` (the Env protocol of `envs.base`), which pool workers construct from its import
    path with the run's `envs.env_kwargs` for this env."""

    name: str
    module: str
    env_class: str
    catalogue: str = "catalogue"  # the module's function: split -> [Task]
    splits: tuple[str, ...] | None = None  # what `split` may be (None: any; the catalogue says)
    # "GROUP/split" splits: each group (sciworld's levels, tau2's domains) -> its splits (empty: `splits`)
    split_groups: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    group_label: str = "group"  # what a group is called in errors ("level", "domain")
    path_suffix: str = ""  # the split is a path to a file ending so (jsonl: ".jsonl")
    extra: str | None = None  # the pip extra that provides the module's dependencies
    system_prompt: str | None = None  # the agent's (else the env's reset observations carry theirs)
    # The module's function returning every text the env writes (its templates, object names):
    # what a word-level vocabulary of the env (`model.vocabulary`) is built from.
    vocabulary: str | None = None
    # Whether instances may run at once in threads of one pool worker (each its own state: no
    # module state shared between instances, no thread-unsafe library). False: a worker runs
    # this env's requests one at a time (CPU-bound envs lose nothing by it: threads share a core).
    concurrent: bool = True

    @property
    def import_path(self) -> str:
        """"module:Class", what a pool worker imports to build the env."""
        return f"{self.module}:{self.env_class}"


SCIWORLD_LEVEL_SPLITS = {"official": ("train", "dev", "test"), "L0": ("train", "test"), "L1": ("train", "test"),
                         "L2": ("train", "test")}  # ScienceWorld's levels and their splits ("L1/test")
TAU2_DOMAINS = ("retail", "airline", "telecom")

# The built-in environments, one registration each (tests/envs check the splits against each
# module's own). `register` adds one from outside the package.
ENVS: dict[str, EnvSpec] = {spec.name: spec for spec in (
    EnvSpec("letters", "jaxscaffold.envs.letters", "LettersEnv", splits=("train", "test")),
    # A bare split is the default level L0's (the FEE reference code's lists). Concurrent: each
    # instance drives its own JVM through its own py4j gateway (JVM launches take a module lock).
    EnvSpec("sciworld", "jaxscaffold.envs.sciworld", "ScienceWorldEnv", splits=SCIWORLD_LEVEL_SPLITS["L0"],
            split_groups=SCIWORLD_LEVEL_SPLITS, group_label="level", extra="envs"),
    # Not audited for threads (bfcl-eval's backend classes; TextWorld / fast-downward and ALFWorld's
    # import, which sets $ALFWORLD_DATA), and CPU-bound: their instances in one worker take turns.
    EnvSpec("bfcl", "jaxscaffold.envs.bfcl", "BFCLEnv", splits=("train", "validation"), extra="envs",
            concurrent=False),
    EnvSpec("alfworld", "jaxscaffold.envs.alfworld", "ALFWorldEnv", extra="envs", concurrent=False,
            splits=("train", "valid_seen", "valid_unseen", "eval_in_distribution", "eval_out_of_distribution",
                    "in_distribution", "out_of_distribution")),
    EnvSpec("tau2", "jaxscaffold.envs.tau2", "Tau2Env", splits=("train", "test", "base"),
            split_groups={d: () for d in TAU2_DOMAINS}, group_label="domain", extra="tau2"),
    EnvSpec("jsonl", "jaxscaffold.envs.jsonl", "JsonlEnv", path_suffix=".jsonl"),  # split = a .jsonl path
    # The CPU testbed for FEE (its words make the `rooms` vocabulary).
    EnvSpec("rooms", "jaxscaffold.envs.rooms", "RoomsEnv", splits=("train", "test"), vocabulary="vocabulary_texts"),
    # Steps that sleep: the rollout benchmark's.
    EnvSpec("latency", "jaxscaffold.envs.latency", "LatencyEnv", splits=("train", "test")),
)}


def register(spec: EnvSpec | str, module: str | None = None, env_class: str | None = None, *,
             catalogue: str = "catalogue", splits: tuple[str, ...] | None = None, extra: str | None = None,
             system_prompt: str | None = None, concurrent: bool = True) -> EnvSpec:
    """Adds (or replaces) an environment: `register(EnvSpec(...))`, or the same fields as
    arguments (`register(name, module, env_class, splits=..., ...)`). A config file can call it
    before returning its config; pool workers construct the env from its import path. Its
    feedback forms, if any, are `feedback.enrichers.register_feedback`'s."""
    if not isinstance(spec, EnvSpec):
        spec = EnvSpec(spec, module, env_class, catalogue=catalogue, splits=None if splits is None else tuple(splits),
                       extra=extra, system_prompt=system_prompt, concurrent=concurrent)
    if not spec.name.isidentifier():
        raise ValueError(f"environment name {spec.name!r} must be an identifier (it is a metric and task-spec key)")
    ENVS[spec.name] = spec
    if spec.system_prompt is not None:
        from jaxscaffold.envs import prompts
        prompts.SYSTEM_PROMPTS[spec.name] = spec.system_prompt
    return spec


def spec(name: str) -> EnvSpec:
    """The registered spec of env `name` (KeyError naming the known ones)."""
    if name not in ENVS:
        raise KeyError(f"unknown environment {name!r}; known: {sorted(ENVS)}")
    return ENVS[name]


def import_path(name: str) -> str:
    """"module:Class" of env `name` (what a pool worker imports to build it)."""
    return spec(name).import_path


def import_paths() -> dict[str, str]:
    """Every registered env's import path, by name (the pool's factories)."""
    return {name: s.import_path for name, s in ENVS.items()}


def check_split(name: str, split: str) -> None:
    """Raises ValueError (one line) unless env `name` has a split `split` (an env registered
    without its splits takes any; its catalogue says)."""
    if name not in ENVS:
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(ENVS)}")
    s = ENVS[name]
    if s.path_suffix:
        if not split.endswith(s.path_suffix):
            raise ValueError(f"{name}'s split is a path to a {s.path_suffix} file ({name}:PATH[:N]), got {split!r}")
        return
    splits = s.splits
    if s.split_groups and "/" in split:  # "L1/test": a group and its split
        group, split = split.split("/", 1)
        if group not in s.split_groups:
            raise ValueError(f"{name} has no {s.group_label} {group!r}; {s.group_label}s: {', '.join(s.split_groups)}")
        if s.split_groups[group]:
            splits = s.split_groups[group]
            if split not in splits:
                raise ValueError(f"{name} {s.group_label} {group} has no split {split!r}; splits: {', '.join(splits)}")
            return
    if splits is not None and split not in splits:
        raise ValueError(f"{name} has no split {split!r}; splits: {', '.join(splits)}")


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
    module, extra = spec(name).module, spec(name).extra
    try:
        return importlib.import_module(module)
    except ImportError as e:
        hint = f"pip install -e '.[{extra}]'" if extra else "pip install -e ."
        raise MissingEnvDependency(f"environment {name!r} needs {e.name or e}: install it with `{hint}` "
                                   f"(or `bash launch/dev.sh test`, which installs every extra)") from e


def catalogue(name: str, split: str, **kwargs) -> list[Task]:
    """Env `name`'s tasks of `split` (its module's catalogue)."""
    return getattr(_module(name), spec(name).catalogue)(split, **kwargs)


def factory(name: str, **kwargs) -> Callable[[], Env]:
    """A no-argument constructor of env `name` with `kwargs` (in-process envs, `LocalEnvs`)."""
    cls = getattr(_module(name), spec(name).env_class)
    return lambda: cls(**kwargs)


def vocabulary_texts(name: str) -> tuple[str, ...]:
    """Every text env `name` writes (its spec's `vocabulary` function; ValueError if it has none)."""
    if spec(name).vocabulary is None:
        raise ValueError(f"environment {name!r} declares no vocabulary (EnvSpec.vocabulary)")
    return tuple(getattr(_module(name), spec(name).vocabulary)())
