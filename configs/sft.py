"""Supervised fine-tuning (`job = "sft"`, `jaxscaffold.train.workloads.sft`): the tiny model of
configs/tiny.py fitted to the gold answers of its letters tasks with token-level cross-entropy,
evaluated greedily on held-out letters tasks as an RL run is.

The demonstrations are the gold trajectories of `envs.train` (each env's gold path, only the
episodes it wins). Your own prompts and answers: a JSONL file of {"prompt", "answer"} lines,

  PYTHONPATH=. python launch/tpu_train.py --config sft.py \
    --config.envs.train=jsonl:my_tasks.jsonl --config.envs.eval=jsonl:my_tasks.jsonl
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import tiny  # noqa: E402


def get_config():
    c = tiny.get_config()
    c.job = "sft"
    c.out_dir = "runs/sft"
    c.steps = 20
    c.rl.lr = 1e-3  # AdamW on the demonstrations (the run's optimizer: rl.weight_decay, rl.warmup_steps too)
    c.rollout.tasks_per_step = 8  # demonstrations per step, drawn with replacement
    c.eval.every = 10
    c.checkpoint.every = 10
    return c
