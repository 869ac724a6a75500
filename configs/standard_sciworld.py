"""The baseline of fee_sciworld.py: `scripts/train.sh sciworld <algorithm> standard` (the plain
`sciworld` env, no feedback), every other setting the same."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import fee_sciworld  # noqa: E402


def get_config():
    c = fee_sciworld.get_config()
    c.out_dir = "runs/standard_sciworld"
    c.feedback.schedule = "none"
    return c
