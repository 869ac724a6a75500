"""RWML stage 1 on tau2-bench: 6 rollouts per task. Then stage 2: `--config rwml_policy_tau2.py`.

Reward. The paper used Qwen3-Embedding-8B with the distance alone, tau_d 0.4 (RL) / 0.15
(filter): the reference setting, `--config.rwml.embedder=qwen3 --config.rwml.embedder_path=DIR
--config.rwml.reward=embedding --config.rwml.tau_d=0.4 --config.rwml.filter.tau_d=0.15`.
The default is the offline MiniLM, calibrated on tau2 *training* tasks without a user model
(`python experiments/calibration/calibrate.py --env tau2 --tasks 60 --steps 20 --json`: the explorer's
gold calls and probe calls, telecom solo; 590 triples): tau_d 0.38 (the best balanced
accuracy), filter 0.35 (0.9 of the true states within it). MiniLM cannot tell tau2's JSON
states apart: one changed value, id or status moves the distance by 0.001 (median) and every
such near miss passes (changed JSON value / id / status 1.00, a flipped device state or
number in telecom's text 1.00; distance only: balanced accuracy 0.68, near misses 0.87,
action-echo 0.16). So the reward is `embedding_facts`, which requires every JSON leaf (and a
text result's ids, numbers, ON / OFF words) to match: near misses 0.00 (another action's
outcome 0.01), true states 0.92, action-echo 0.00, balanced accuracy 0.90.

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
    c.rwml.embedder = "minilm"  # offline; the paper's Qwen3-Embedding-8B reference: see the docstring
    c.rwml.reward = "embedding_facts"  # MiniLM passes every one-value JSON near miss by distance alone
    c.rwml.tau_d = 0.38  # calibrated for minilm (docstring); the paper, Qwen3-Embedding-8B: 0.4
    c.rwml.filter.tau_d = 0.35  # calibrated for minilm; the paper, Qwen3-Embedding-8B: 0.15
    # the agent's system prompt (policy + tool schemas, Qwen3 tokens, measured on every train and
    # test task): retail 4,865, airline 4,926, telecom 7,232 (10,049 solo, without a user), before
    # 15 collecting turns; as rwml_policy_tau2.py. World-model prompts carry no system prompt
    # (the initial observation and 5 steps of at most rwml.max_obs_chars each): they fit too.
    c.rollout.max_len = 32768
    c.envs.step_timeout_s = 900.0  # a worker's step waits for its episodes' user replies
    c.model.preset = "qwen3-8b"  # the paper's tau2 base (ALFWorld's is Qwen2.5-7B-Instruct: configs/rwml.py)
    return c
