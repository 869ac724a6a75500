"""RWML stage 2 on tau2-bench: ordinary task RL (GRPO on tau2's 0/1 reward) from the
world-model checkpoint of `rwml_tau2.py`, as `rwml_policy.py` does for ALFWorld.

Starts from stage 1's HF export (`runs/rwml_tau2/hf` by default; the base is Qwen3-8B, the
paper's tau2 model); gamma 1.0 (episode reward); 15 env steps per episode in training, 30 in
evaluation (the paper). Trains on tau2's train split of all three domains and evaluates on its
whole test split (retail 40, airline 20, telecom 40 tasks), reported per domain
(`eval/success_tau2/retail`, `.../airline`, `.../telecom`; training: `rollout/success_tau2/...`).
The user simulator must be named: `--config.envs.tau2_user.hf_path=DIR` (a local chat model,
served by our sampler in the trainer's process) or `mode=endpoint` with `url` (see
configs/base.py). The paper does not name its user model; tau2's own default is gpt-4.1.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import rwml_policy  # noqa: E402


def get_config():
    c = rwml_policy.get_config()
    c.out_dir = "runs/rwml_policy_tau2"
    c.model.hf_path = "runs/rwml_tau2/hf"  # stage 1's export (rwml_tau2.py's rwml.export_dir)
    c.rollout.max_len = 32768  # the system prompt alone (policy + tool schemas) is 4.8k (retail, airline) to 7.2k (telecom) Qwen3 tokens, before 15 turns
    c.envs.train = "tau2"
    c.envs.eval = "tau2"  # the test split of every domain (categories: the domains)
    c.envs.step_timeout_s = 900.0  # a worker's step waits for its episodes' user replies
    c.eval.tasks = 0  # all 100 test tasks
    return c
