"""The baseline of the FEE paper: the same run in the standard environment (no feedback)."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import fee  # noqa: E402


def get_config():
    c = fee.get_config()
    c.out_dir = "runs/standard"
    c.feedback.schedule = "none"
    return c
