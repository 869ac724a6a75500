"""How the project's programs are compiled: XLA options per backend, and a `jit` that applies
them (the sampler's programs, where they were measured to help)."""

from __future__ import annotations

import functools
from typing import Callable

import jax

# XLA:CPU runs dots in YNNPACK. By default a dot of bf16 operands accumulating in f32 takes
# YNNPACK's bf16 kernel, slow on a CPU without bf16 dot instructions (AVX2); with YNNPACK's
# dot fusion asked for, the bf16 -> f32 widening is fused into the dot and its f32 kernel
# runs. Measured on such a CPU: 24 matrices [4096, 768] times 8 rows, 13 ms against 22 ms
# (f32: 14 ms either way); in interleaved runs, a bf16 decode step of the ~100M benchmark model
# 27.0 against 36.4 ms (f32: 25.0 against 25.7 ms). A bf16 train step of that model ran at the
# same speed with and without (10.4 s), so train steps keep XLA's defaults. CPUs with bf16 dot
# instructions keep them too (their bf16 kernel is the fast one, shared/REFERENCE.md §8).
_CPU_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"}  # XLA_FLAGS spells it "dot"
_BF16_DOT_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86, and Arm's `Features` line


@functools.cache
def cpu_has_bf16_dots(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the host CPU advertises bf16 dot-product instructions (Linux; else False)."""
    try:
        with open(cpuinfo) as f:
            words = set(f.read().split())
    except OSError:
        return False
    return any(flag in words for flag in _BF16_DOT_FLAGS)


def compiler_options(backend: str | None = None) -> dict[str, str] | None:
    """XLA options for programs compiled for `backend` (default: JAX's default backend)."""
    backend = backend or jax.default_backend()
    return dict(_CPU_OPTIONS) if backend == "cpu" and not cpu_has_bf16_dots() else None


def jit(fun: Callable, **jit_kwargs) -> Callable:
    """`jax.jit(fun, **jit_kwargs)` with `compiler_options()` of the default backend, looked up
    at the first call (importing a module must not start JAX's backends)."""

    @functools.cache
    def jitted(backend: str):
        return jax.jit(fun, compiler_options=compiler_options(backend), **jit_kwargs)

    @functools.wraps(fun)
    def call(*args, **kwargs):
        return jitted(jax.default_backend())(*args, **kwargs)

    call.lower = lambda *args, **kwargs: jitted(jax.default_backend()).lower(*args, **kwargs)
    return call
