#!/usr/bin/env bash
# The device check on a lent accelerator (under 8 minutes on one H200): writes one JSON file.
#   bash launch/device_check.sh [OUT_FILE] [--quick] [--hbm-tbps X] [--peak-tflops Y]
# OUT_FILE default: $OUT/device_check.json, else ./device_check.json (`--out FILE` works too);
# flags go to launch/device_check.py (--quick: tiny shapes, a CPU dry run of the same code).
# Runs the checkout's .venv/bin/python when there is one (else python3). Needs jax with CUDA
# (or TPU), torch and transformers.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.}/device_check.json"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then  # a first argument that is not a flag: the output file
  out="$1"; shift
fi
py=python3
if [ -x .venv/bin/python ]; then py=.venv/bin/python; fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false XLA_PYTHON_CLIENT_PREALLOCATE=false
# A later --out among the flags wins over this one (argparse keeps the last).
exec timeout 480 "$py" launch/device_check.py --out "$out" "$@"
