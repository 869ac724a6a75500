#!/usr/bin/env bash
# Installs jaxscaffold and every package it needs with a given pip, as launch/dev.sh's set-up
# does (also the Colab notebook's install cell):
#   bash launch/install_packages.sh PIP EXTRAS [BENCHMARKS]   e.g.  .venv/bin/pip test,envs,rwml,tau2
#                                                                   pip tpu sciworld
# BENCHMARKS: `all` (the default) adds every benchmark package; `sciworld` adds ScienceWorld
# alone (its pin in pyproject.toml), all that configs/colab.py runs. The benchmark packages of
# `all` are installed without their declared dependencies (their dependency sets pull CUDA
# torch, spacy or old numpy pins: see pyproject.toml's `envs` extra).
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: install_packages.sh PIP EXTRAS [all|sciworld]"
pip_cmd="${1:?$usage}"; extras="${2:?$usage}"; benchmarks="${3:-all}"
case "$benchmarks" in
  sciworld)
    $pip_cmd install -q -e ".[$extras]" "$(grep -o '"scienceworld==[^"]*"' pyproject.toml | tr -d '"')"
    exit 0 ;;
  all) ;;
  *) echo "error: BENCHMARKS is all or sciworld, not '$benchmarks' ($usage)" >&2; exit 2 ;;
esac
$pip_cmd install -q -e ".[$extras]"
$pip_cmd install -q --no-deps bfcl-eval==2025.7.17 alfworld==0.4.2 textworld==1.7.0
# These two build C/C++ code whose build script calls `python` from PATH: pip's own.
bindir="$(cd "$(dirname "$(command -v "${pip_cmd%% *}")")" && pwd)"
PATH="$bindir:$PATH" $pip_cmd install -q --no-deps fast-downward-textworld==20.6.4 jericho==3.3.1
