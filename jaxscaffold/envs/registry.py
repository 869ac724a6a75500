"""Environment names -> task catalogues and constructors, imported lazily so a missing
optional dependency only matters when its environment is used (and then says how to install)."""

from __future__ import annotations

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
}


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
