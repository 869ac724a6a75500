"""RWML stage 2: ordinary task RL (GRPO on success) on ALFWorld from the world-model checkpoint.

Starts from stage 1's HF export (`runs/rwml/hf` by default); gamma 1.0 (episode reward),
15 env steps per episode in training, 30 in evaluation (the paper). One evaluation runs both of
the paper's ALFWorld sets: valid_seen (in-distribution, 140 games) and valid_unseen
(out-of-distribution, 134), reported apart as `eval/success_alfworld/valid_seen` and
`eval/success_alfworld/valid_unseen` (and pooled as `eval/success_alfworld`).
tau2's stage 2 is `rwml_policy_tau2.py`.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import base  # noqa: E402


def get_config():
    c = base.get_config()
    c.out_dir = "runs/rwml_policy"
    c.steps = 150
    c.model.hf_path = "runs/rwml/hf"  # stage 1's export (rwml.export_dir)
    c.rl.algorithm = "grpo"
    c.rl.lr = 1e-6
    c.rollout.tasks_per_step = 16
    c.rollout.group_size = 8
    c.rollout.max_turns = 15  # the paper: 15 env steps in training
    c.rollout.max_new_tokens = 1024
    c.rollout.max_len = 16384
    c.envs.train = "alfworld"
    c.envs.eval = "alfworld:valid_seen,alfworld:valid_unseen"  # in- and out-of-distribution, each reported
    c.feedback.schedule = "none"  # RWML's policy stage is the standard env
    c.eval.max_turns = 30  # the paper: 30 in evaluation
    c.eval.tasks = 140  # per entry at most: all of valid_seen (140) and valid_unseen (134)
    c.mesh.fsdp = -1
    c.mesh.data = 1
    return c
