"""The entropy analysis (the paper: without entropy regularisation the standard env's policy
entropy collapses to ~0 near step 250 while FEE's stays stable through 300 steps; Qwen3-4B):
fee_sciworld.py run for 300 steps with the entropy bonus off. `train/entropy` is the curve;
its pair is entropy_standard.py. The paper names neither the benchmark nor the algorithm of
this run: ScienceWorld and GRPO here (override with --config.envs.* / --config.rl.algorithm)."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import fee_sciworld  # noqa: E402


def make(c, out_dir: str):
    c.out_dir = out_dir
    c.steps = 300  # the paper's stability analysis: 300 training steps
    c.rl.entropy_coef = 0.0  # no entropy regularisation (as the reference's entropy_coeff=0)
    c.model.preset = "qwen3-4b"
    c.feedback.switch_step = 100  # AG -> OE at step 100, as in the 200-step runs
    return c


def get_config():
    return make(fee_sciworld.get_config(), "runs/entropy_fee")
