#!/usr/bin/env bash
# Installs jaxscaffold and every package it needs with a given pip, as launch/dev.sh's set-up
# does (also the Colab notebook's install cell):
#   bash launch/install_packages.sh PIP EXTRAS        e.g.  .venv/bin/pip test,envs,rwml,tau2
#                                                            pip tpu,envs
# The benchmark packages below are installed without their declared dependencies (their
# dependency sets pull CUDA torch, spacy or old numpy pins: see pyproject.toml's `envs` extra).
set -euo pipefail
cd "$(dirname "$0")/.."
pip_cmd="${1:?usage: install_packages.sh PIP EXTRAS}"; extras="${2:?usage: install_packages.sh PIP EXTRAS}"
$pip_cmd install -q -e ".[$extras]"
$pip_cmd install -q --no-deps bfcl-eval==2025.7.17 alfworld==0.4.2 textworld==1.7.0
# These two build C/C++ code whose build script calls `python` from PATH: pip's own.
bindir="$(cd "$(dirname "$(command -v "${pip_cmd%% *}")")" && pwd)"
PATH="$bindir:$PATH" $pip_cmd install -q --no-deps fast-downward-textworld==20.6.4 jericho==3.3.1
