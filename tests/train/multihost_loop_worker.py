"""One process of the multi-host training-loop test (run by test_multihost.py): the tiny config's
real loop (rollouts with a learned feedback schedule, checkpoints, evaluation) on the toy `coin`
env, 2 CPU devices in all, split over `num_processes` processes, for each variant in turn: full
fine-tuning, LoRA (rollouts with the merged parameters), bounded staleness (rollout.max_staleness
= 1: rollouts in the collector's thread) and, on several processes, DAPO, a refused staleness
run and partial rollouts (with DAPO; and the staleness run's config with no version published
mid-collect). Writes its histories and the episodes it ran; process 0 also the final parameters
(LoRA: the adapters) and the logs."""

import json
import os
import sys
import threading

import numpy as np

from tests.train.multihost_setup import configure  # noqa: E402

process_id, num_processes, out = configure(total_devices=2)
import jax  # noqa: E402

from jax.experimental import multihost_utils  # noqa: E402

from tests.train import toy_envs  # noqa: E402
from tests.train.configs import tiny_config  # noqa: E402
from jaxscaffold.train.trainer import train  # noqa: E402
from jaxscaffold.train.update import train_on  # noqa: E402
from jaxscaffold.train.workloads.env_rl import EnvWorkload  # noqa: E402

toy_envs.register()

ran = []  # (step, group, task id, reward, won) of every episode this process trained on


class Recording(EnvWorkload):
    def collect(self, job, params, step, **kw):
        episodes, stats = super().collect(job, params, step, **kw)
        ran.extend([step, e.group, e.task.task_id, e.reward, e.won] for e in episodes)
        return episodes, stats


# Every run here is on tiny_config's word vocabulary (`words=True`), a few hundred ids instead of
# Qwen3's 151,936: the coin env rewards any text (by its CRC), so what these runs check (the same
# episodes and steps on one process and on two) does not depend on the words (its texts are
# unknown words to it: one id).

# Sampled rollouts (T = 1) in groups of two: an episode's sampling seeds derive from its global
# episode id, so each process samples exactly the episodes one process would (test_multihost.py).
cfg = tiny_config(os.path.join(out, "run"), steps=2, words=True, **{
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
cfg = tiny_config(os.path.join(out, "lora"), steps=2, words=True, **{
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
    cfg = tiny_config(os.path.join(out, "dapo"), steps=2, words=True, **{
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
stale = {
    "rollout.tasks_per_step": 4, "rollout.group_size": 2, "rollout.temperature": 1.0,
    "rollout.max_turns": 3, "rollout.max_len": 256, "envs.train": "coin", "envs.eval": "coin",
    "feedback.schedule": "bandit", "feedback.bandit_signal": "success", "feedback.bandit_arms": "ag_early,oe_early",
    "eval.every": 2, "eval.tasks": 4, "checkpoint.every": 3, "mesh.devices": 0, "rollout.sampler_devices": 1,
    "rollout.max_staleness": 1}
cfg = tiny_config(os.path.join(out, "stale"), steps=3, words=True, **stale)
result = train(cfg, workload=Recording)
with open(os.path.join(out, f"process{process_id}_stale.json"), "w") as f:
    json.dump({"history": result["history"], "ran": ran}, f)

if num_processes > 1:
    class Unmarked(EnvWorkload):  # a collect that may issue device collectives of its own
        collects_off_main_thread = False

    refused = ""
    try:
        train(tiny_config(os.path.join(out, "refused"), steps=1, words=True, **{
            "rollout.tasks_per_step": 4, "envs.train": "coin", "eval.every": 0, "mesh.devices": 0,
            "rollout.sampler_devices": 1, "rollout.max_staleness": 1}), workload=Unmarked)
    except ValueError as e:
        refused = str(e)
    with open(os.path.join(out, f"process{process_id}_refused.json"), "w") as f:
        json.dump({"refused": refused}, f)

    # Partial rollouts with DAPO: the collector's thread decides after each generation batch on
    # every process's groups (gathers over the key-value store) while a newer version may arrive
    # mid-episode; where it arrives depends on timing, so the test checks what holds for any.
    rows = []  # every training row this process trained on: [step, group, rollout, {version: tokens}, sampled]

    class RecordingVersions(EnvWorkload):
        def collect(self, job, params, step, **kw):
            episodes, stats = super().collect(job, params, step, **kw)
            for e in episodes:
                rollout = sum(r[:2] == [step, e.group] for r in rows)  # (a row per episode: tiny's representation)
                for conv in e.training_rows():
                    versions = {}
                    for v in conv.sampled_versions():
                        versions[str(v)] = versions.get(str(v), 0) + 1
                    rows.append([step, e.group, rollout, versions, sum(conv.assistant_mask)])
            return episodes, stats

    cfg = tiny_config(os.path.join(out, "partial"), steps=3, words=True, **{
        "rl.algorithm": "dapo", "rollout.tasks_per_step": 4, "rollout.group_size": 4,
        "rollout.max_turns": 3, "rollout.max_len": 256, "envs.train": "coin", "envs.eval": "coin",
        "eval.every": 0, "checkpoint.every": 3, "mesh.devices": 0, "rollout.sampler_devices": 1,
        "rollout.max_staleness": 1, "rollout.partial": True, "rollout.decode_chunk": 2})
    result = train(cfg, workload=RecordingVersions)
    with open(os.path.join(out, f"process{process_id}_partial.json"), "w") as f:
        json.dump({"history": result["history"], "rows": rows}, f)

    # Partial rollouts where no version arrives mid-collect: the update of step s returns (and
    # version s is published) only once step s + 1 is collected, so every collect decodes with
    # its scheduled version throughout, as the staleness run above does (its first 2 steps: the
    # learning rate is constant).
    class CollectsBeforePublish(Recording):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            self.collected, self.trained = {}, 0

        def _done(self, step):
            return self.collected.setdefault(step, threading.Event())

        def collect(self, job, params, step, **kw):
            out = super().collect(job, params, step, **kw)
            self._done(step).set()
            return out

        def train_on(self, job, state, episodes):
            out = train_on(job, state, episodes)
            self.trained += 1
            if self.trained < job.cfg.steps and not self._done(self.trained + 1).wait(600):
                raise RuntimeError(f"step {self.trained + 1} was not collected within 600 s")
            return out

    ran.clear()
    cfg = tiny_config(os.path.join(out, "unswapped"), steps=2, words=True, **{**stale, "rollout.partial": True})
    result = train(cfg, workload=CollectsBeforePublish)
    with open(os.path.join(out, f"process{process_id}_unswapped.json"), "w") as f:
        json.dump({"history": result["history"], "ran": ran}, f)
