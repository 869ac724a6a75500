"""The reference's runs as configs: each validates, and its key values are the
reference's, quoted below from EnvAsScaffold's `scripts/train.sh` (and the yaml it overrides)."""

import json
import os

import pytest

from jaxscaffold import config as config_lib
from jaxscaffold.train import config_checks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# scripts/train.sh:
#   sciworld) ENV_NAME=sciworld; VAL_SIZE=128; MAX_STEPS=15 ;;
#   bfcl) ENV_NAME=bfcl; VAL_SIZE=400; MAX_STEPS=50 ;;
#   enriched: sciworld_diversev7 / bfcl_diversev3; inconsistent: sciworld_diversev8 (SciWorld only)
#   TRAIN_SIZE=16 GROUP_SIZE=8; ppo_mini_batch_size=$((TRAIN_SIZE * GROUP_SIZE)) (= 128 rows:
#   actor_rollout_ref.rollout.n stays 1); data.max_prompt_length=8192 data.max_response_length=2048;
#   optim.lr=1e-6; entropy_coeff=0; use_kl_loss=False; total_training_steps=200; test_freq=5
# ppo_trainer.yaml: ppo_epochs 1, weight_decay 0.01, grad_clip 1.0, env.history_length 2,
#   rollout temperature 1.0, top_p 1, filter_groups.max_num_gen_batches 10
# The reference code: val_before_train=True; DAPO with no overlong shaping; step rows count in
#   their group's statistics (verl-agent's default); validation with the training horizon; make_envs' ScienceWorld
#   simplifications "easy"; old log-probs recomputed by the actor; ScienceWorld's "probability
#   0.5" = the first half of the groups, BFCL's a per-group seeded coin; the inconsistent
#   ablation = even-indexed envs of each group.
SHARED = {"steps": 200, "rl.lr": 1e-6, "rl.weight_decay": 0.01, "rl.grad_clip": 1.0, "rl.ppo_epochs": 1,
          "rl.kl_coef": 0.0, "rl.entropy_coef": 0.0, "rl.minibatch_rows": 128, "rl.num_minibatches": 1,
          "rl.recompute_old_logprobs": True, "rl.tis_cap": 0.0, "rl.dynamic_sampling_exhausted": "continue",
          "rollout.tasks_per_step": 16, "rollout.group_size": 8, "rollout.max_new_tokens": 2048,
          "rollout.max_len": 8192 + 2048, "rollout.temperature": 1.0, "rollout.top_p": 1.0,
          "rollout.representation": "stepwise", "rollout.history_window": 2, "eval.every": 5,
          "eval.at_start": True, "rl.overlong_buffer": 0, "rl.group_stats": "row"}
SCIWORLD = {**SHARED, "envs.train": "sciworld", "envs.eval": "sciworld", "rollout.max_turns": 15,
            "eval.max_turns": 15, "eval.tasks": 128, "feedback.mode": "first_half"}
BFCL = {**SHARED, "envs.train": "bfcl", "envs.eval": "bfcl:validation", "rollout.max_turns": 50,
        "eval.max_turns": 50, "eval.tasks": 400, "feedback.mode": "group", "envs.env_kwargs": ""}
FEE = {"feedback.schedule": "ag_early_oe_late_reference", "feedback.ag_form": "reference",
       "feedback.oe_form": "reference", "feedback.probability": 0.5, "feedback.switch_step": 100}
EXPECTED = {
    "fee_sciworld": {**SCIWORLD, **FEE},
    "standard_sciworld": {**SCIWORLD, "feedback.schedule": "none"},
    "fee_bfcl": {**BFCL, **FEE},
    "standard_bfcl": {**BFCL, "feedback.schedule": "none"},
    "fee_sciworld_inconsistent": {**SCIWORLD, **FEE, "feedback.mode": "even"},
    "entropy_fee": {**SCIWORLD, **FEE, "steps": 300, "model.preset": "qwen3-4b"},
    "entropy_standard": {**SCIWORLD, "feedback.schedule": "none", "steps": 300, "model.preset": "qwen3-4b"},
}


def _get(cfg, path):
    node = cfg
    for part in path.split("."):
        node = getattr(node, part)
    return node


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_reference_run_configs_validate_and_hold_the_references_values(name):
    cfg = config_lib.from_configdict(config_lib.load_file(os.path.join(ROOT, "configs", f"{name}.py")))
    config_lib.validate(cfg)
    config_checks.check(cfg)  # and the names other modules define
    for path, want in EXPECTED[name].items():
        assert _get(cfg, path) == want, (name, path)
    if cfg.envs.train == "sciworld":
        assert cfg.envs.kwargs() == {"sciworld": {"simplifications": "easy"}}
    assert cfg.out_dir == f"runs/{name}"


def test_the_joint_run_stays_ours():
    """fee.py keeps our joint setting (both benchmarks, whole trajectories, one step a batch)."""
    cfg = config_lib.from_configdict(config_lib.load_file(os.path.join(ROOT, "configs", "fee.py")))
    assert cfg.envs.train == "sciworld,bfcl" and cfg.rollout.representation == "trajectory"
    assert (cfg.rl.minibatch_rows, cfg.rl.num_minibatches, cfg.rl.recompute_old_logprobs) == (0, 1, False)
    assert json.loads(cfg.envs.env_kwargs or "{}") == {}
