"""FEE pilot grid: oe late feedback only, all of training, on ScienceWorld (Qwen3-4B-Thinking-2507,
GRPO, 200 steps, 16 environments per step, rollout length 15, lr 1e-6, eval every 5 steps)."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import fee  # noqa: E402


def get_config():
    c = fee.get_config()
    c.out_dir = "runs/pilot_oe_late"
    c.envs.train = "sciworld"
    c.envs.eval = "sciworld"
    c.feedback.schedule = "oe_late"
    return c
