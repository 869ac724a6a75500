"""The baseline of fee_bfcl.py: `scripts/train.sh bfcl <algorithm> standard` (the plain `bfcl`
env, no feedback), every other setting the same."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import fee_bfcl  # noqa: E402


def get_config():
    c = fee_bfcl.get_config()
    c.out_dir = "runs/standard_bfcl"
    c.feedback.schedule = "none"
    return c
