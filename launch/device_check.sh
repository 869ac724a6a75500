#!/usr/bin/env bash
# The device check on a lent accelerator (under 8 minutes on one H200): writes one JSON file.
#   bash launch/device_check.sh [OUT_FILE]       (default: $OUT/device_check.json, else ./device_check.json)
# Needs jax with CUDA (or TPU), torch and transformers; see launch/device_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-.}/device_check.json}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false XLA_PYTHON_CLIENT_PREALLOCATE=false
exec timeout 480 python launch/device_check.py --out "$out"
