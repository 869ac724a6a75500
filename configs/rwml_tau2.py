"""RWML stage 1 on tau2-bench: 6 rollouts per task, the paper's tau2 thresholds (set for
Qwen3-Embedding-8B: RL tau_d 0.4, filter 0.15; recalibrate with launch/rwml_calibrate.py for
another embedder). Then stage 2: `--config rwml_policy_tau2.py`.

The collecting rollouts talk to tau2's user simulator, so the next state after a message to
the user is the user's reply: name it with `--config.envs.tau2_user.hf_path=DIR` (a local chat
model, served by our sampler in the trainer's process; see configs/base.py) or
`mode=endpoint` with `url`. The paper does not name its user model (tau2's default is gpt-4.1).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import rwml  # noqa: E402


def get_config():
    c = rwml.get_config()
    c.out_dir = "runs/rwml_tau2"
    c.envs.train = "tau2"
    c.envs.eval = "tau2"
    c.rwml.rollouts_per_task = 6
    c.rwml.collect_tasks = 200
    c.rwml.embedder = "qwen3"  # the paper's thresholds below are for Qwen3-Embedding-8B: set rwml.embedder_path
    c.rwml.reward = "embedding"  # the paper's (distance only): tau2's JSON states would need every value exact under embedding_facts
    c.rwml.tau_d = 0.4
    c.rwml.filter.tau_d = 0.15
    c.envs.step_timeout_s = 900.0  # a worker's step waits for its episodes' user replies
    c.model.preset = "qwen3-8b"  # the paper's tau2 base (ALFWorld's is Qwen2.5-7B-Instruct: configs/rwml.py)
    return c
