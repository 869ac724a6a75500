"""The embedded default: the whole loop on CPU in minutes with a tiny random Qwen3 on the
real Qwen3 vocabulary, on the `letters` task where the reward visibly rises."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import base  # noqa: E402


def get_config():
    c = base.get_config()
    c.out_dir = "runs/tiny"
    c.steps = 30
    c.model.preset = "tiny"  # 2 layers, hidden 64, Qwen3 vocabulary (about 10M parameters)
    c.model.compute_dtype = "float32"
    c.model.cache_dtype = "float32"
    c.model.remat_policy = "none"
    c.rl.lr = 3e-2  # a random tiny model on a one-step task: learns in tens of steps
    c.rollout.tasks_per_step = 4
    c.rollout.group_size = 8
    c.rollout.max_turns = 1
    c.rollout.max_new_tokens = 16
    c.rollout.max_len = 128
    c.rollout.enable_thinking = False
    c.envs.train = "letters"
    c.envs.eval = "letters"
    c.envs.num_workers = 1
    c.feedback.schedule = "none"
    c.eval.every = 10
    c.eval.tasks = 16
    c.eval.max_turns = 1
    c.checkpoint.every = 10
    return c
