"""Every environment's `EnvSpec` (`envs.base`), by name: its module and class, catalogue,
splits and what else the package reads of it, each declared beside its env (the module's
`SPEC`). The env modules import their optional dependencies only when an env is built, so a
missing one only matters when its environment is used (and then says how to install it).

Adding an environment: one module (catalogue, Env class and its `SPEC`) and one
`register(SPEC)`."""

from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Callable, Mapping

from jaxscaffold.envs import alfworld, bfcl, jsonl, latency, letters, rooms, sciworld, tau2_spec
from jaxscaffold.envs.base import Env, EnvSpec, Task


# The built-in environments: each module's own `SPEC` (light modules: the optional
# dependencies are imported when an env is built, never here). `register` adds one from outside.
ENVS: dict[str, EnvSpec] = {m.SPEC.name: m.SPEC for m in (
    letters, sciworld, bfcl, alfworld, tau2_spec, jsonl, rooms, latency)}


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
    s = spec(name)
    build = functools.reduce(getattr, [s.env_class, *filter(None, [s.constructor])], _module(name))
    return lambda: build(**kwargs)


def vocabulary_texts(name: str) -> tuple[str, ...]:
    """Every text env `name` writes (its spec's `vocabulary` function; ValueError if it has none)."""
    if spec(name).vocabulary is None:
        raise ValueError(f"environment {name!r} declares no vocabulary (EnvSpec.vocabulary)")
    return tuple(getattr(_module(name), spec(name).vocabulary)())
