"""Per-platform tuning, chosen once: the only code (with `compiler.py`) that looks at the
platform. The model (`models/qwen3.py`) is the same everywhere; a backend decides how a
platform runs it:

  cpu.CPU                   per-layer decode layout in column blocks, bf16 cache as bits,
                            windowed cache reads, custom-VJP dense layers, YNNPACK options
  accelerator.Accelerator   TPU / GPU: stacked weights scanned, plain (or paged) cache,
                            windowed cache reads, autodiff

A backend provides, for the sampler: `prepare(params, config)` (its weight layout; a no-op on
prepared ones), `is_prepared(params)`, `kv_cache` ("contiguous", or "paged": the stacked
layout's option, `Accelerator(kv_cache="paged", page_size=)`), `empty_cache(config, batch,
max_len, dtype)` (paged: `pages=`, the pool's size),
`kv_sharding(config, mesh, rules)`, `hidden_states(params, config, tokens, segment_ids_BT=,
cache=, window=)` and `unembed(params, config, h)`, `windowed` (whether a call attends over a
bucketed cache prefix); for training, `with_kernels(config)` (the config carrying its dense /
gather kernels and its attention kernel); for inference without a cache (the embedder),
`with_attention(config)` ("auto" attention resolved: cuDNN on GPU, splash on one TPU, else
the pure-JAX flash kernel on accelerators and XLA's on CPU); for the compiler, `compiler_options()`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax

from jaxscaffold.backends import accelerator, cpu


def for_platform(name: str):
    """The backend of a JAX platform name ("cpu", "gpu", "tpu", ...); a sampler's (its
    column blocks, say) comes from `for_sampler`."""
    return cpu.CPU() if name == "cpu" else accelerator.Accelerator(platform=name)


@functools.cache
def current():
    """The backend of JAX's default platform (looked up once, at the first call)."""
    return for_platform(jax.default_backend())


def for_sampler(layout: str = "auto", *, mesh=None, column_blocks: int | None = None, kv_cache: str = "contiguous",
                page_size: int = 64):
    """The backend a sampler decodes with: the platform's ("auto"), or the one of a layout
    ("per_layer": the CPU's, in `column_blocks` blocks; "stacked": the accelerators'), with
    its cache ("contiguous", or "paged" in pages of `page_size` tokens: the stacked layout's)."""
    if layout == "auto":
        layout = current().layout
    if layout == "per_layer":
        if kv_cache != "contiguous":
            raise ValueError(f"kv_cache={kv_cache!r} is the stacked layout's (the TPU / GPU sampler's); the CPU's "
                             "per_layer layout has a contiguous cache (layout='stacked' to page on CPU)")
        return cpu.CPU(column_blocks=cpu.default_column_blocks(mesh) if column_blocks is None else column_blocks)
    if layout == "stacked":
        platform = current()
        platform = platform if isinstance(platform, accelerator.Accelerator) else accelerator.Accelerator()
        return dataclasses.replace(platform, kv_cache=kv_cache, page_size=page_size)
    raise ValueError(f"unknown sampler layout {layout!r} (per_layer, stacked, auto)")
