"""One process of the split-pod test (run by test_multihost_split.py): 8 CPU devices in all,
over `num_processes` processes, `mesh.rollout_devices = 4` (on 2 processes the first two
devices of each train and its last two sample, tensor parallel; on one, the first four train
and the sampler runs on two of the last four), bounded staleness 1, the tiny config's loop on
the toy `coin` env with the bandit's feedback and an evaluation at the last step. Writes the
history, the episodes it ran and, for every published version, where the copy lives and
whether it equals the training state's parameters bitwise."""

import json
import os

import numpy as np

from tests.train.multihost_setup import configure  # noqa: E402

process_id, num_processes, out = configure(total_devices=8)
import jax  # noqa: E402

from jax.experimental import multihost_utils  # noqa: E402

from jaxscaffold.train import trainer  # noqa: E402
from tests.train import toy_envs  # noqa: E402
from tests.train.configs import tiny_config  # noqa: E402
from jaxscaffold.train.workloads.env_rl import EnvWorkload  # noqa: E402

toy_envs.register()

ran = []  # (step, group, task id, reward, won, the episode's training tokens) of this process's episodes
published = []  # per published version: where, and whether it equals the training state


class Recording(EnvWorkload):
    def collect(self, job, params, step, **kw):
        episodes, stats = super().collect(job, params, step, **kw)
        ran.extend([step, e.group, e.task.task_id, e.reward, e.won,
                    [list(map(int, c.ids)) for c in e.training_rows()]] for e in episodes)
        return episodes, stats


def _devices(tree) -> list[int]:
    return sorted({d.id for x in jax.tree.leaves(tree) for d in x.sharding.device_set})


class Checked(trainer.AheadCollector):
    """The collector with its publish watched: the copy is made with host transfers forbidden
    (device to device only), then compared bitwise with the training state it was made from."""

    def publish(self, params, version):
        with jax.transfer_guard_host_to_device("disallow"), jax.transfer_guard_device_to_host("disallow"):
            super().publish(params, version)
        if version not in self._params:  # (no later step samples with it)
            return
        copy = self._params[version]
        # The whole training state on every process (a collective: the main thread, every process at once).
        state = jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), params)
        equal = all(np.array_equal(np.asarray(c), s, equal_nan=True) and np.asarray(c).dtype == s.dtype
                    for c, s in zip(jax.tree.leaves(copy), jax.tree.leaves(state), strict=True))
        published.append({"version": version, "equal": equal, "copy_devices": _devices(copy),
                          "state_devices": _devices(params),
                          "checksum": float(sum(np.abs(s.astype(np.float64)).sum() for s in jax.tree.leaves(state)))})


trainer.AheadCollector = Checked
# On the word vocabulary (tiny_config's `words`): coin rewards any text, and what the test checks
# (the same episodes, metrics and published copies on one process and on two) does not depend on it.
cfg = tiny_config(os.path.join(out, "run"), steps=3, words=True, **{
    "rollout.tasks_per_step": 2, "rollout.group_size": 2, "rollout.temperature": 1.0,
    "rollout.max_turns": 2, "rollout.max_len": 128, "envs.train": "coin",
    "feedback.schedule": "bandit", "feedback.bandit_signal": "success", "feedback.bandit_arms": "ag_early,oe_early",
    # Evaluation at the last step: its episodes sample on the rollout devices too.
    "eval.every": 3, "eval.tasks": 4, "checkpoint.every": 3, "mesh.devices": 0,
    "mesh.rollout_devices": 4, "rollout.max_staleness": 1,
    # One process samples on 2 of its 4 rollout devices, as each of 2 processes does on its 2
    # (tensor parallel over two devices either way: the same rounding).
    "rollout.sampler_devices": 2,
})
result = trainer.train(cfg, workload=Recording)
assert jax.process_count() == num_processes and jax.device_count() == 8
with open(os.path.join(out, f"process{process_id}.json"), "w") as f:
    json.dump({"history": result["history"], "ran": ran, "published": published,
               "local_devices": [d.id for d in jax.local_devices()]}, f)
