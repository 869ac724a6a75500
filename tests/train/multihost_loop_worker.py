"""One process of the multi-host training-loop test (run by test_multihost.py): the tiny config's
real loop (rollouts with a learned feedback schedule, checkpoints, evaluation) on the toy `coin`
env, 2 CPU devices in all, split over `num_processes` processes, for each variant in turn: full
fine-tuning, LoRA (rollouts with the merged parameters), bounded staleness (rollout.max_staleness
= 1: rollouts in the collector's thread) and, on several processes, DAPO and a refused staleness
run. Writes its histories and the episodes it ran; process 0 also the final parameters
(LoRA: the adapters) and the logs."""

import json
import os
import sys

import numpy as np

from tests.train.multihost_setup import configure  # noqa: E402

process_id, num_processes, out = configure(total_devices=2)
import jax  # noqa: E402

from jax.experimental import multihost_utils  # noqa: E402

from tests.train import toy_envs  # noqa: E402
from tests.train.configs import tiny_config  # noqa: E402
from jaxscaffold.train.trainer import train  # noqa: E402
from jaxscaffold.train.workloads.env_rl import EnvWorkload  # noqa: E402

toy_envs.register()

ran = []  # (step, group, task id, reward, won) of every episode this process trained on


class Recording(EnvWorkload):
    def collect(self, job, params, step, **kw):
        episodes, stats = super().collect(job, params, step, **kw)
        ran.extend([step, e.group, e.task.task_id, e.reward, e.won] for e in episodes)
        return episodes, stats


# Sampled rollouts (T = 1) in groups of two: an episode's sampling seeds derive from its global
# episode id, so each process samples exactly the episodes one process would (test_multihost.py).
cfg = tiny_config(os.path.join(out, "run"), steps=2, **{
    "rollout.tasks_per_step": 4, "rollout.group_size": 2, "rollout.temperature": 1.0,
    "rollout.max_turns": 3, "rollout.max_len": 256, "envs.train": "coin", "envs.eval": "coin",
    "feedback.schedule": "bandit", "feedback.bandit_signal": "success",
    # Arms that act within 3 turns (the late windows start at episode step 5), so the feedback
    # log the test compares is not empty by the luck of the bandit's and the groups' draws.
    "feedback.bandit_arms": "ag_early,oe_early",
    "eval.every": 2, "eval.tasks": 4, "checkpoint.every": 2, "mesh.devices": 0,
    # One process of 2 devices samples as each of the 2 processes of one device does: on one
    # device (the default would be tensor parallel over both, which rounds the logits apart).
    "rollout.sampler_devices": 1,
})
result = train(cfg, workload=Recording)
assert jax.process_count() == num_processes and jax.device_count() == 2
with open(os.path.join(out, f"process{process_id}.json"), "w") as f:
    json.dump({"history": result["history"], "ran": ran}, f)
params = jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), result["state"].params)
if process_id == 0:
    np.savez(os.path.join(out, "params.npz"),
             **{jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(params)[0]})

# LoRA: the same loop on the adapters, rollouts decoding with the base merged with them.
cfg = tiny_config(os.path.join(out, "lora"), steps=2, **{
    "rollout.tasks_per_step": 4, "rollout.group_size": 2, "rollout.temperature": 1.0,
    "rollout.max_turns": 3, "rollout.max_len": 256, "envs.train": "coin", "envs.eval": "coin",
    "eval.every": 2, "eval.tasks": 4, "checkpoint.every": 2, "mesh.devices": 0,
    "lora.rank": 4, "lora.base_dtype": "float32", "rl.lr": 3e-2, "rollout.sampler_devices": 1,
})
result = train(cfg)
with open(os.path.join(out, f"process{process_id}_lora.json"), "w") as f:
    json.dump({"history": result["history"]}, f)
params = jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), result["state"].params)
if process_id == 0:
    np.savez(os.path.join(out, "adapters.npz"),
             **{jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(params)[0]})

if num_processes > 1:
    # DAPO's dynamic sampling on several processes: each fills its share of the groups, all
    # keep generating (and taking tasks) until every one is full, so the streams stay equal.
    ran.clear()
    cfg = tiny_config(os.path.join(out, "dapo"), steps=2, **{
        "rl.algorithm": "dapo", "rollout.tasks_per_step": 4, "rollout.group_size": 4,
        "rollout.max_turns": 3, "rollout.max_len": 256, "envs.train": "coin", "envs.eval": "coin",
        "eval.every": 0, "checkpoint.every": 2, "mesh.devices": 0, "rollout.sampler_devices": 1})
    result = train(cfg, workload=Recording)
    won = {}
    for step, group, _, _, success in ran:  # the kept episodes' success by group
        won.setdefault(f"{step}/{group}", []).append(success)
    with open(os.path.join(out, f"process{process_id}_dapo.json"), "w") as f:
        json.dump({"history": result["history"], "won": won}, f)

# Bounded staleness: the next step's rollouts run in the collector's thread while this one
# trains (its gathers over the coordination service's key-value store), evaluation pausing it.
ran.clear()
cfg = tiny_config(os.path.join(out, "stale"), steps=3, **{
    "rollout.tasks_per_step": 4, "rollout.group_size": 2, "rollout.temperature": 1.0,
    "rollout.max_turns": 3, "rollout.max_len": 256, "envs.train": "coin", "envs.eval": "coin",
    "feedback.schedule": "bandit", "feedback.bandit_signal": "success", "feedback.bandit_arms": "ag_early,oe_early",
    "eval.every": 2, "eval.tasks": 4, "checkpoint.every": 3, "mesh.devices": 0, "rollout.sampler_devices": 1,
    "rollout.max_staleness": 1})
result = train(cfg, workload=Recording)
with open(os.path.join(out, f"process{process_id}_stale.json"), "w") as f:
    json.dump({"history": result["history"], "ran": ran}, f)

if num_processes > 1:
    class Unmarked(EnvWorkload):  # a collect that may issue device collectives of its own
        collects_off_main_thread = False

    refused = ""
    try:
        train(tiny_config(os.path.join(out, "refused"), steps=1, **{
            "rollout.tasks_per_step": 4, "envs.train": "coin", "eval.every": 0, "mesh.devices": 0,
            "rollout.sampler_devices": 1, "rollout.max_staleness": 1}), workload=Unmarked)
    except ValueError as e:
        refused = str(e)
    with open(os.path.join(out, f"process{process_id}_refused.json"), "w") as f:
        json.dump({"refused": refused}, f)
