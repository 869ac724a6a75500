"""The in-group random ablation (the paper: feedback randomised inside a GRPO group makes
training oscillate): `scripts/train.sh sciworld <algorithm> inconsistent`, the reference's
`sciworld_diversev8` env, SciWorld only. As coded there, the even-indexed rollouts of every
group get the feedback (feedback.mode = "even"); the paper's reading, an independent coin per
rollout, is `--config.feedback.mode=rollout`. Everything else as fee_sciworld.py."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import fee_sciworld  # noqa: E402


def get_config():
    c = fee_sciworld.get_config()
    c.out_dir = "runs/fee_sciworld_inconsistent"
    c.feedback.mode = "even"
    return c
