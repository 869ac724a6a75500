"""The FEE pilot grid on ScienceWorld (Qwen3-4B-Thinking-2507 in the paper, GRPO, 200 steps,
16 environments per step, rollout length 15, lr 1e-6, eval every 5 steps). Without a variant
this file runs the paper's winner, AG-early & OE-late; a variant picks one cell of the grid,
one feedback type at one timing through all of training:

  python launch/tpu_train.py --config pilot.py:ag_early   # or ag_late, oe_early, oe_late
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import fee  # noqa: E402

# The grid's cells, each a `feedback.schedule` (see feedback/schedule.py).
VARIANTS = ("ag_early", "ag_late", "oe_early", "oe_late")


def make(schedule: str):
    c = fee.get_config()
    c.out_dir = f"runs/pilot_{schedule}"
    c.envs.train = "sciworld"
    c.envs.eval = "sciworld::128"  # 128 test tasks, balanced over its task types
    c.feedback.schedule = schedule  # ag_early | ag_late | oe_early | oe_late | ag_early_oe_late
    return c


def get_config(variant: str | None = None):
    return make(variant or "ag_early_oe_late")
