"""Environment throughput through the pool (the agent's code path), gold actions:
steps/s with 1 and N workers per env type, and ScienceWorld's lazy step vs its stock step()."""

from __future__ import annotations

import os
import time

from benchmarks.common import REPORT
from jaxscaffold.envs import registry
from jaxscaffold.envs.gold import GOLD_ENV_KWARGS, GoldPolicy
from jaxscaffold.envs.base import is_failure
from jaxscaffold.envs.pool import EnvPool
from jaxscaffold.feedback import enrichers

SPLITS = {"sciworld": "test", "bfcl": "validation", "alfworld": "valid_unseen", "letters": "test", "tau2": "test"}


def steps_per_second(env: str, tasks, workers: int, env_kwargs=None, max_steps: int = 40) -> float:
    kwargs = enrichers.env_kwargs({env: {**GOLD_ENV_KWARGS.get(env, {}), **(env_kwargs or {})}})
    with EnvPool(workers, env_kwargs=kwargs) as pool:
        obs = pool.reset(tasks)
        policies = {i: GoldPolicy(env, o) for i, o in enumerate(obs) if not is_failure(o)}
        live = {i: obs[i] for i in policies}
        steps, t0 = 0, time.perf_counter()
        for _ in range(max_steps):
            if not live:
                break
            out = pool.step({i: policies[i].act(o) for i, o in live.items()})
            steps += len(out)
            live = {i: r.observation for i, r in out.items() if not is_failure(r) and not r.done}
        return steps / (time.perf_counter() - t0)


def run(quick: bool = False) -> None:
    n = os.cpu_count() or 2
    envs = ["letters", "bfcl", "sciworld"] + (["alfworld"] if os.environ.get("ALFWORLD_DATA") else [])
    try:
        registry.catalogue("tau2", "test")
        envs.append("tau2")
    except ImportError:
        REPORT.say("# tau2 skipped: install the tau2 extra")
    REPORT.say(f"# envs: gold actions through EnvPool; {n} workers = the cores"
               + ("" if "alfworld" in envs else " (set ALFWORLD_DATA to include ALFWorld)"))
    episodes = 2 * n
    for env in envs:
        tasks = registry.catalogue(env, SPLITS[env])
        tasks = tasks[:: max(1, len(tasks) // episodes)][:episodes]  # tau2: every domain
        one = steps_per_second(env, tasks, 1)
        many = steps_per_second(env, tasks, n)
        REPORT.figure(f"{env}: steps/s, 1 worker", one, "steps/s")
        REPORT.figure(f"{env}: steps/s, {n} workers", many, "steps/s", many / one)
    tasks = registry.catalogue("sciworld", "test")[:2]
    lazy = steps_per_second("sciworld", tasks, 1)
    stock = steps_per_second("sciworld", tasks, 1, {"stock_step": True})
    REPORT.figure("sciworld: lazy-valid-actions step vs stock step(), steps/s", lazy, "steps/s", lazy / stock)
