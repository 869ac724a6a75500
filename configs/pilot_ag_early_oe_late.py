"""FEE pilot grid: the combined AG-early & OE-late schedule (switch at step 100) on ScienceWorld."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import fee  # noqa: E402


def get_config():
    c = fee.get_config()
    c.out_dir = "runs/pilot_ag_early_oe_late"
    c.envs.train = "sciworld"
    c.envs.eval = "sciworld"
    return c
