"""The start-up memory check: a run that cannot fit its devices stops before it loads a model.

`launch/plan.py` prints the full plan; a training run computes the same plan
(`memory_plan.plan`, compiled for the run's own devices and worst-case batch) and refuses to
start, in one line naming the phase that does not fit and the knobs that help, when its peak
exceeds the device's memory. The device's memory is its allocator's limit (`memory_stats()`
on TPU and GPU) or `memory.hbm_gb`; XLA:CPU reports none, so on CPU the check runs only when
`memory.hbm_gb` is set.
"""

from __future__ import annotations

import logging

import jax

from jaxscaffold.config import RunConfig
from jaxscaffold.models.sharding import maybe_initialize_distributed
from jaxscaffold.train import memory_plan
from jaxscaffold.train.job import mesh_devices

log = logging.getLogger(__name__)


class PlanDoesNotFit(ValueError):
    """The run's memory plan exceeds its devices' memory (bad input: the config)."""


def device_memory_bytes(device) -> float | None:
    """The memory one device can hand out (its allocator's limit), or None where it reports none."""
    try:
        stats = device.memory_stats()
    except Exception:  # backends without the call (XLA:CPU raises or returns None)
        return None
    return float(stats["bytes_limit"]) if stats and stats.get("bytes_limit") else None


def check_fits(cfg: RunConfig, devices: list | None = None) -> memory_plan.MemoryPlan | None:
    """The plan of `cfg` on `devices` (default: the run's mesh devices); raises PlanDoesNotFit
    when its peak exceeds their memory. None when there is nothing to check against (or
    `memory.check_at_start` is off)."""
    if not cfg.memory.check_at_start:
        return None
    if devices is None:
        maybe_initialize_distributed()  # before the first device query, as build_job does
        devices = mesh_devices(cfg) or jax.devices()
    hbm = cfg.memory.hbm_gb * 1e9 if cfg.memory.hbm_gb else device_memory_bytes(devices[0])
    if hbm is None:
        log.debug("memory check skipped: %s reports no memory limit (set memory.hbm_gb)", devices[0].platform)
        return None
    result = memory_plan.plan(cfg, hbm_bytes=hbm, devices=devices, hosts=jax.process_count())
    if not result.fits():
        raise PlanDoesNotFit(
            f"the run does not fit {len(devices)} device(s) of {hbm / 1e9:.1f} GB: " + "; ".join(result.advice(cfg))
            + " (the per-device table: python launch/plan.py with the same --config; "
            "--config.memory.check_at_start=False skips this check)")
    log.info("memory plan: peak %.2f GB of %.2f GB per device", result.peak / 1e9, hbm / 1e9)
    return result
