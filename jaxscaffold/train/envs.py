"""The environments of a run, from `config.envs`: a pool of worker processes or in-process."""

from __future__ import annotations

from typing import Iterable

from jaxscaffold.config import RunConfig
from jaxscaffold.envs import registry
from jaxscaffold.envs.base import EnvBatch
from jaxscaffold.envs.local import LocalEnvs
from jaxscaffold.envs.pool import EnvPool
from jaxscaffold.feedback import enrichers


def make_envs(cfg: RunConfig, names: Iterable[str]) -> EnvBatch:
    """The process pool (`envs.num_workers` > 0) or in-process envs, with `envs.env_kwargs`
    and the hooks feedback needs inside the envs (BFCL's observation enhancement)."""
    kwargs = enrichers.env_kwargs(cfg.envs.kwargs())
    if cfg.envs.num_workers > 0:  # the workers build envs by import path: registered ones too
        factories = {n: registry.import_path(n) for n in registry.ENVS}
        return EnvPool(cfg.envs.num_workers, step_timeout_s=cfg.envs.step_timeout_s, env_kwargs=kwargs,
                       factories=factories)
    return LocalEnvs({n: registry.factory(n, **kwargs.get(n, {})) for n in names})
