#!/usr/bin/env bash
# One command per job on a fresh machine: sets up .venv (once), then runs the job.
#   bash launch/dev.sh demo    # the main job on the embedded default (configs/tiny.py, CPU)
#   bash launch/dev.sh test    # the whole test suite, a line per test
#   bash launch/dev.sh test-quick    # a few fast tests per module (tests/quick_suite.txt)
#   bash launch/dev.sh bench train   # a benchmark (launch/bench.py), with the same allocator
set -euo pipefail
cd "$(dirname "$0")/.."
job="${1:-test}"; shift || true

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.jaxscaffold-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setting up .venv (once; a few quiet minutes): pip; PyTorch 2.13, CPU build (the tests' reference);" \
       "jaxscaffold with its test, envs, rwml, tau2 and wandb extras (JAX for CPU, transformers, ScienceWorld," \
       "tau2-bench, wandb ...); then bfcl-eval, ALFWorld and textworld, and fast-downward and jericho" \
       "(built from source)" >&2
  .venv/bin/pip install -q --upgrade pip
  # The CPU build of PyTorch is the parity reference (transformers' Qwen3) in tests;
  # pinning it first keeps pip from pulling a multi-GB CUDA build.
  .venv/bin/pip install -q "torch==2.13.0"
  # The package, its extras and the benchmark packages installed without their dependencies.
  bash launch/install_packages.sh .venv/bin/pip test,envs,rwml,tau2,wandb
  touch "$stamp"
  echo "set up: .venv ready" >&2
fi

export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# tcmalloc where the machine has it (Debian/Ubuntu: libtcmalloc-minimal4; .ci/run installs it).
# XLA:CPU mallocs large buffers afresh on every call and glibc returns them to the kernel on
# free, so every call page-faults them in again (a [8, 16, 151936] f32 logits buffer: 19k
# faults, 40-55 ms for an op that takes 14 ms on tcmalloc, which keeps the pages).
# awk reads to the end: exiting at the match would SIGPIPE ldconfig, and pipefail makes that fatal.
tcmalloc="$(/sbin/ldconfig -p 2>/dev/null | awk '/libtcmalloc_minimal\.so\.4 / && !found {print $NF; found=1}')"
if [ -n "$tcmalloc" ] && [ -z "${JAXSCAFFOLD_NO_TCMALLOC:-}" ]; then
  export LD_PRELOAD="$tcmalloc${LD_PRELOAD:+:$LD_PRELOAD}" TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD=68719476736
fi
case "$job" in
  demo) exec .venv/bin/python launch/tpu_train.py --config tiny.py "$@" ;;
  # -v: a line per test, naming its module, as it finishes (-q printed dots only). worksteal: a
  # worker that runs out takes tests from the other's queue (tests/conftest.py orders them)
  test) exec .venv/bin/python -m pytest -v -n 2 --dist worksteal --durations=40 "$@" ;;
  test-quick)
    mapfile -t quick < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' tests/quick_suite.txt | grep -v '^$')
    exec .venv/bin/python -m pytest -v -n 2 --dist worksteal --durations=10 "${quick[@]}" "$@" ;;
  bench) exec .venv/bin/python launch/bench.py "$@" ;;
  *) echo "usage: bash launch/dev.sh {demo|test|test-quick|bench} [args]" >&2; exit 2 ;;
esac
