"""One process of the multi-host LoRA loop test (run by test_multihost_lora.py): the tiny
config's real loop with LoRA on the toy `coin` env (rollouts with the merged parameters,
evaluation, checkpoints), 2 CPU devices in all, split over `num_processes` processes."""

import json
import os

import numpy as np

from tests.train.multihost_setup import configure

process_id, num_processes, out = configure(total_devices=2)
import jax
from jax.experimental import multihost_utils

from jaxscaffold.train.trainer import train
from tests.train import toy_envs
from tests.train.configs import tiny_config

toy_envs.register()
cfg = tiny_config(os.path.join(out, "run"), steps=2, **{
    "rollout.tasks_per_step": 4, "rollout.group_size": 2, "rollout.temperature": 1.0,
    "rollout.max_turns": 3, "rollout.max_len": 256, "envs.train": "coin", "envs.eval": "coin",
    "eval.every": 2, "eval.tasks": 4, "checkpoint.every": 2, "mesh.devices": 0,
    "lora.rank": 4, "lora.base_dtype": "float32", "rl.lr": 3e-2,
    # One process of 2 devices samples as each of the 2 processes of one device does: on one
    # device (the default would be tensor parallel over both, which rounds the logits apart).
    "rollout.sampler_devices": 1,
})
result = train(cfg)
assert jax.process_count() == num_processes and jax.device_count() == 2
with open(os.path.join(out, f"process{process_id}.json"), "w") as f:
    json.dump({"history": result["history"]}, f)
params = jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), result["state"].params)
if process_id == 0:
    np.savez(os.path.join(out, "adapters.npz"),
             **{jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(params)[0]})
