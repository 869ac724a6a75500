"""Test-wide setup: 8 fake CPU devices for sharding tests (must precede importing jax)."""

import os

# Tests run small models, where XLA:CPU's compile time dominates; LLVM's -O0 codegen compiles
# a train step of the test model in 4.5 s instead of 8.3 s (dots still run in their libraries).
# Not `--xla_cpu_use_fusion_emitters=false` (2.3 s): its programs, loaded back from the
# persistent cache below, crashed the sharded train-step test. Test subprocesses that set
# their own XLA_FLAGS add these (JAXSCAFFOLD_TEST_XLA_FLAGS).
os.environ.setdefault("JAXSCAFFOLD_TEST_XLA_FLAGS", "--xla_backend_optimization_level=0")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 " + os.environ["JAXSCAFFOLD_TEST_XLA_FLAGS"])
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Many tests build the same programs (samplers, train steps and initialisers of the same small
# models); JAX's persistent compilation cache compiles each once per run. Set here, before
# pytest-xdist starts its workers, so they and the test subprocesses share it; its file lock
# (on when a maximum size is set) keeps concurrent readers and writers safe.
_CACHE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".pytest_cache", "jax-compile")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 * 2**30))


def pytest_collection_modifyitems(items):
    """Slow tests first (a stable sort): pytest-xdist hands tests out in this order, so the long
    ones start early and the short ones fill in at the end, instead of one worker finishing a
    long test alone while the other idles."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
