"""How the project's programs are compiled: a `jit` that applies the platform backend's XLA
options (`backends.cpu.compiler_options`: the sampler's programs, where they were measured to
help)."""

from __future__ import annotations

import functools
from typing import Callable

import jax

from jaxscaffold import backends


def compiler_options(platform: str | None = None) -> dict[str, str] | None:
    """XLA options for programs compiled for `platform` (default: JAX's default backend)."""
    return backends.for_platform(platform or jax.default_backend()).compiler_options()


def jit(fun: Callable, **jit_kwargs) -> Callable:
    """`jax.jit(fun, **jit_kwargs)` with `compiler_options()` of the default backend, looked up
    at the first call (importing a module must not start JAX's backends)."""

    @functools.cache
    def jitted(platform: str):
        return jax.jit(fun, compiler_options=compiler_options(platform), **jit_kwargs)

    @functools.wraps(fun)
    def call(*args, **kwargs):
        return jitted(jax.default_backend())(*args, **kwargs)

    call.lower = lambda *args, **kwargs: jitted(jax.default_backend()).lower(*args, **kwargs)
    return call
