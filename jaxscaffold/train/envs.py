"""The environments of a run, from `config.envs`: a pool of worker processes or in-process,
with tau2's user simulator (`train.user_model`) when the run has tau2."""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from jaxscaffold.config import RunConfig
from jaxscaffold.envs import registry
from jaxscaffold.envs.base import EnvBatch, EpisodeFailure, Observation, StepResult, Task
from jaxscaffold.envs.local import LocalEnvs
from jaxscaffold.envs.pool import EnvPool
from jaxscaffold.feedback import enrichers
from jaxscaffold.train import user_model


class ServedEnvs:
    """An EnvBatch whose envs use a server this run started (tau2's user model): closing the
    envs stops it."""

    def __init__(self, envs: EnvBatch, server):
        self.envs, self.server = envs, server

    def reset(self, tasks: Sequence[Task]) -> list[Observation | EpisodeFailure]:
        return self.envs.reset(tasks)

    def step(self, actions: Mapping[int, str]) -> dict[int, StepResult | EpisodeFailure]:
        return self.envs.step(actions)

    def __getattr__(self, name: str):  # the rest of the envs' interface (the pool's asynchronous one)
        if name == "envs":  # not set yet (e.g. while unpickling)
            raise AttributeError(name)
        return getattr(self.envs, name)

    def close(self) -> None:
        try:
            self.envs.close()
        finally:
            self.server.stop()


def make_envs(cfg: RunConfig, names: Iterable[str]) -> EnvBatch:
    """The process pool (`envs.num_workers` > 0) or in-process envs, with `envs.env_kwargs`,
    the hooks feedback needs inside the envs (BFCL's observation enhancement) and, where tau2
    runs, its user simulator (`envs.tau2_user`: served here unless an endpoint or none)."""
    names = set(names)
    kwargs = enrichers.env_kwargs(cfg.envs.kwargs())
    server = None
    if "tau2" in names:
        user, server = user_model.start_tau2_user(cfg.envs.tau2_user)
        kwargs["tau2"] = {**kwargs.get("tau2", {}), "user": user}
    try:
        envs = _envs(cfg, names, kwargs)
    except BaseException:
        if server is not None:
            server.stop()
        raise
    return envs if server is None else ServedEnvs(envs, server)


def _envs(cfg: RunConfig, names: set[str], kwargs: dict) -> EnvBatch:
    if cfg.envs.num_workers > 0:  # the workers build envs by the registry's import paths: registered ones too
        return EnvPool(cfg.envs.num_workers, step_timeout_s=cfg.envs.step_timeout_s,
                       reset_timeout_s=cfg.envs.reset_timeout_s, env_kwargs=kwargs)
    return LocalEnvs({n: registry.factory(n, **kwargs.get(n, {})) for n in names})
