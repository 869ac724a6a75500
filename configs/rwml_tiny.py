"""RWML's embedded default: both stages on CPU in minutes with a tiny random Qwen3 on real
ALFWorld triples (set $ALFWORLD_DATA). A random tiny policy cannot act, so its triples come
from the scripted explorer (expert or random admissible steps: the env's real transitions).

    python launch/tpu_train.py --config rwml_tiny.py
    python launch/tpu_train.py --config rwml_policy.py --config.model.hf_path=runs/rwml_tiny/hf \\
        --config.model.preset=tiny ...   (see tests/train/test_rwml.py for a CPU-sized stage 2)
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import rwml  # noqa: E402


def get_config():
    c = rwml.get_config()
    c.out_dir = "runs/rwml_tiny"
    c.steps = 20
    c.rwml.epochs = 0  # a demo: the 20 steps as given
    c.model.preset = "tiny"
    c.model.compute_dtype = "float32"
    c.model.cache_dtype = "float32"
    c.model.remat_policy = "none"
    c.rl.lr = 1e-3  # a random tiny model: large steps to see the world-model reward move
    c.rollout.tasks_per_step = 4
    c.rollout.group_size = 4
    c.rollout.max_new_tokens = 24
    c.rollout.max_len = 1024
    c.envs.train_split = "valid_seen"  # the smallest split that unpacks whole
    c.envs.num_workers = 1
    c.rwml.collect_policy = "explore"
    c.rwml.collect_tasks = 12
    c.rwml.rollouts_per_task = 1
    c.rwml.collect_max_turns = 8
    c.rwml.history_window = 1
    c.rwml.max_obs_chars = 600
    c.rwml.heldout_share = 0.2
    c.rwml.filter.sft_steps = 5
    c.rwml.filter.sft_batch = 4
    c.rwml.filter.sft_lr = 1e-3
    c.rwml.filter.samples = 4
    c.eval.every = 10
    c.eval.tasks = 16
    c.checkpoint.every = 10
    c.mesh.fsdp = 1
    c.mesh.data = -1
    return c
