"""The environments of a run, from `config.envs`: a pool of worker processes or in-process."""

from __future__ import annotations

import json

from jaxscaffold.envs import registry
from jaxscaffold.envs.pool import EnvPool
from jaxscaffold.train.rollouts import LocalEnvs


def env_kwargs(cfg) -> dict[str, dict]:
    """`config.envs.env_kwargs`: JSON {env name: constructor kwargs}, e.g. tau2's user endpoint."""
    text = cfg.envs.env_kwargs
    try:
        out = json.loads(text) if text else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"config.envs.env_kwargs is not JSON ({e}): {text!r}") from e
    if not isinstance(out, dict) or not all(isinstance(v, dict) for v in out.values()):
        raise ValueError(f"config.envs.env_kwargs must map env names to kwargs objects: {text!r}")
    return out


def make_envs(cfg, names):
    """The environments of a run: the process pool (`envs.num_workers` > 0) or in-process."""
    kwargs = env_kwargs(cfg)
    if cfg.envs.num_workers > 0:
        return EnvPool(cfg.envs.num_workers, step_timeout_s=cfg.envs.step_timeout_s, env_kwargs=kwargs)
    return LocalEnvs({n: registry.factory(n, **kwargs.get(n, {})) for n in names})
