"""Test-wide setup: 8 fake CPU devices for sharding tests (must precede importing jax)."""

import os
import subprocess
import sys

import pytest

# Tests run small models, where XLA:CPU's compile time dominates. Two flags cut it: LLVM's -O0
# codegen (dots still run in their libraries), and XLA:CPU's classic loop emitters instead of
# its fusion emitters (a train step of the test model compiles in 1.1 s instead of 2.9 s; run
# times are about the same). Test subprocesses that set their own XLA_FLAGS add these
# (JAXSCAFFOLD_TEST_XLA_FLAGS).
#
# The classic emitters round some fused reductions differently by batch size, so properties
# of exact rounding (a row samples the same tokens whatever batch it is decoded in, which
# multi-host rollouts rely on) are checked with XLA's default emitters, as a run compiles
# them: `@pytest.mark.default_emitters` tests run in a subprocess with
# JAXSCAFFOLD_EXACT_XLA_FLAGS, and test subprocesses that compare such runs use those flags.
os.environ.setdefault("JAXSCAFFOLD_EXACT_XLA_FLAGS", "--xla_backend_optimization_level=0")
os.environ.setdefault("JAXSCAFFOLD_TEST_XLA_FLAGS",
                      os.environ["JAXSCAFFOLD_EXACT_XLA_FLAGS"] + " --xla_cpu_use_fusion_emitters=false")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 " + os.environ["JAXSCAFFOLD_TEST_XLA_FLAGS"])
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# No persistent compilation cache: programs compiled with the classic emitters and loaded back
# from it deadlock in their collectives now and then (the sharded train-step test on 8 fake
# devices: "Termination timeout for all reduce ... only 3 of 4 threads arrived", 3 runs in 7
# with a warm cache, none in 5 without). Almost every test compiles programs of its own, so
# the cache saved little (137 s of compile over a whole run, before the flag above).
os.environ.setdefault("JAX_ENABLE_COMPILATION_CACHE", "false")

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_IN_SUBPROCESS = "JAXSCAFFOLD_TEST_SUBPROCESS"


def pytest_configure(config):
    config.addinivalue_line("markers", "default_emitters: runs in a subprocess compiled with XLA:CPU's "
                                       "default emitters (tests of exact, batch-independent rounding)")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Runs a `default_emitters` test in a pytest subprocess with JAXSCAFFOLD_EXACT_XLA_FLAGS."""
    if pyfuncitem.get_closest_marker("default_emitters") is None or os.environ.get(_IN_SUBPROCESS):
        return None
    flags = os.environ["JAXSCAFFOLD_EXACT_XLA_FLAGS"]
    env = dict(os.environ, JAXSCAFFOLD_TEST_XLA_FLAGS=flags, **{_IN_SUBPROCESS: "1"},
               XLA_FLAGS="--xla_force_host_platform_device_count=8 " + flags)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          pyfuncitem.nodeid], cwd=_ROOT, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.fail(f"in a subprocess with XLA_FLAGS={env['XLA_FLAGS']!r}:\n{out.stdout[-4000:]}{out.stderr[-2000:]}",
                    pytrace=False)
    return True


def pytest_collection_modifyitems(config, items):
    """Slow tests first, so the long ones start early and the short ones fill in at the end.
    Under `--dist worksteal` (`launch/dev.sh test`), each of the N workers is given one contiguous
    Nth of this order, and a worker that runs out takes over the tail of another's queue: so the
    slow tests are dealt out, each Nth beginning with every Nth of them. (Under xdist's default
    `--dist load`, the first worker's first batch held every slow test, and it ran its last ~130
    tests alone while the other idled: ~190 s of a 1,319 s run.)"""
    slow = [item for item in items if item.get_closest_marker("slow")]
    rest = [item for item in items if not item.get_closest_marker("slow")]
    # Collection runs in the workers, where xdist has reset `--dist` to "no": the controller
    # hands its mode over (`pytest_configure_node`).
    stealing = getattr(config, "workerinput", {}).get("dist_mode", getattr(config.option, "dist", "no")) == "worksteal"
    items[:] = dealt_order(slow, rest, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) if stealing else 1)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """(xdist controller) Tells each worker the `--dist` mode, which xdist resets there."""
    node.workerinput["dist_mode"] = getattr(node.config.option, "dist", "no")


def dealt_order(slow: list, rest: list, workers: int) -> list:
    """`slow` + `rest` in `workers` contiguous shares of worksteal's sizes (the first of n
    pending tests gets n // workers, and so on), share k starting with slow[k::workers]."""
    order, left, rest = [], len(slow) + len(rest), list(rest)
    for k in range(workers):
        size = left // (workers - k)
        share = slow[k::workers]
        fill = max(0, size - len(share))
        order += share + rest[:fill]
        rest = rest[fill:]
        left -= len(share) + fill
    return order + rest


# Why long-lived pytest-xdist workers crashed inside XLA:CPU's compiler (a segfault or an abort
# in `backend_compile_and_load`, without an XLA message; about one test a full -n 2 run, a
# different one each time, never in a process of its own): every compiled CPU program keeps ~6
# memory mappings of its code while jax caches it, a worker compiles thousands, and at
# vm.max_map_count (65,530 by default) the next mmap fails. The core dump of such a crash
# had 65,417 mappings. So between tests, a worker past half the limit drops jax's
# caches, which unmaps them (300 programs: 441 -> 2,321 -> 510 mappings); the next test only
# recompiles what it uses.
_MAX_MAPPINGS = 30_000


def _mappings() -> int:
    try:
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)
    except OSError:  # not Linux: no such limit to watch
        return 0


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    if "jax" in sys.modules and _mappings() > _MAX_MAPPINGS:
        import gc

        import jax

        jax.clear_caches()
        gc.collect()


# Should a worker crash all the same, its test runs once more, in a fresh worker, and is
# reported as "rerun"; a second crash fails it.
_CRASH_RERUNS: set[str] = set()


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    if crashitem in _CRASH_RERUNS:
        return None
    _CRASH_RERUNS.add(crashitem)
    print(f"\nworker crashed in {crashitem}: running it once more in a fresh worker", file=sys.stderr)
    sched.mark_test_pending(crashitem)
    report.outcome = "rerun"
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(report):
    if report.outcome == "rerun":
        return "rerun", "R", "RERUN"
    return None
