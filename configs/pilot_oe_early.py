"""FEE pilot grid: oe-early feedback only, through all of training (see pilot.py)."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import pilot  # noqa: E402


def get_config():
    return pilot.make("oe_early")
