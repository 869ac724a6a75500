"""FEE on ScienceWorld as the reference run trains it: EnvAsScaffold's `scripts/train.sh
sciworld <algorithm> enriched` (one benchmark per run; `fee.py` training both jointly is ours).

Provenance (EnvAsScaffold `scripts/train.sh`, `verl/trainer/config/ppo_trainer.yaml`,
`agent_system/environments/env_manager.py`):
- `MAX_STEPS=15` -> `env.max_steps`: the rollout horizon, and validation runs with it too
  (the reference's validation settings), so eval.max_turns = 15 (ours in fee.py: 30);
- `VAL_SIZE=128`, greedy validation (`val_kwargs.do_sample: False`), `test_freq=5`;
- `make_envs` defaults ScienceWorld's simplifications to "easy";
- `ppo_mini_batch_size=$((TRAIN_SIZE * GROUP_SIZE))` = 128 with `actor_rollout_ref.rollout.n`
  left at 1 (the group is `env.rollout.n`), so verl's normalisation keeps 128 rows: 128 STEP
  rows per optimizer step, several per rollout batch (clip-higher and GSPO's clip bind);
- old log-probs recomputed by the actor before the update (verl's `compute_log_prob`);
- DAPO (`algorithm.filter_groups.enable=True`, `max_num_gen_batches` 10): trains on what it
  collected after the last generation batch;
- step-wise rows with a 2-step history, the reference's AG / OE texts, windows and "first half
  of the groups" (ScienceWorld's rule): `fee_reference.py`;
- prompt 8192 + response 2048 tokens, lr 1e-6 constant, weight decay 0.01, grad clip 1.0,
  1 PPO epoch, no KL loss, entropy coefficient 0, 16 tasks x group 8, 200 steps: base / fee.
- `val_before_train=True`: an evaluation before the first step (eval.at_start, base.py's default);
- verl-agent's group statistics count every step row (rl.group_stats = "row", fee_reference.py);
- DAPO without overlong shaping (rl.overlong_buffer = 0, base.py's default; the DAPO paper's
  reading: `--config.rl.overlong_buffer=512`).
Algorithm: `--config.rl.algorithm=dapo` or `gspo` (train.sh's second argument).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import fee_reference  # noqa: E402


def get_config():
    c = fee_reference.get_config()
    c.out_dir = "runs/fee_sciworld"
    c.envs.train = "sciworld"
    c.envs.eval = "sciworld"  # the reference's test list (data/sciworld), envs.eval_split "test"
    c.envs.env_kwargs = '{"sciworld": {"simplifications": "easy"}}'  # make_envs' default
    c.rollout.max_turns = 15  # MAX_STEPS=15
    c.rollout.max_len = 8192 + 2048  # data.max_prompt_length + data.max_response_length
    c.eval.max_turns = 15  # validation with the training horizon
    c.eval.tasks = 128  # VAL_SIZE=128
    c.eval.every = 5  # trainer.test_freq=5
    c.rl.minibatch_rows = 128  # ppo_mini_batch_size = TRAIN_SIZE * GROUP_SIZE rows: ceil(rows / 128) optimizer steps
    c.rl.recompute_old_logprobs = True  # the actor's old log-probs, not the sampler's
    c.rl.tis_cap = 0.0  # the reference has no TIS correction
    c.rl.dynamic_sampling_exhausted = "continue"
    return c
