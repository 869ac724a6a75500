"""The rooms testbed (jaxscaffold/envs/rooms.py) on CPU: a tiny model trained from scratch on
the testbed's word-level vocabulary (model.vocabulary = "rooms": ~240 ids instead of Qwen3's
151,936), FEE's default schedule (AG on episode steps 0-2 until `feedback.switch_step`, OE on
steps 5-9 after it). The FEE study (experiments/rooms_fee/study.py) runs its arms from this file."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import base  # noqa: E402


def get_config():
    c = base.get_config()
    c.out_dir = "runs/rooms"
    c.steps = 60
    c.model.preset = "tiny"  # 2 layers, hidden 64; the embedding resized to the vocabulary
    c.model.vocabulary = "rooms"
    c.model.compute_dtype = "float32"
    c.model.cache_dtype = "float32"
    c.model.remat_policy = "none"
    # 1e-3, not 1e-2: at 1e-2 Adam moved every weight by ~1e-2 a step and its moments kept moving
    # them after the gradient was 0, so the FEE study's AG arms lost their wins after the first
    # informative groups (third run, experiments/rooms_fee/observed.md); a pilot at 1e-3 kept them.
    c.rl.lr = 1e-3
    # Up to 448 rows x 512 tokens a step: in one pass the train step held 11-14 GB here (every
    # attention matrix at once), so two study processes ran the 23 GB machine out of memory.
    c.rl.micro_batches = 4
    c.rollout.tasks_per_step = 4
    c.rollout.group_size = 8
    c.rollout.max_turns = 14  # plans are 6-12 actions: a little slack
    c.rollout.max_new_tokens = 8  # an action is 2-6 words
    # The FEE reference code's step-wise rows, each turn's prompt rebuilt from the task and the
    # current observation alone (history_window 0: the observation shows the whole state the
    # agent needs, so the policy is memoryless). A row is <= ~350 tokens where a trajectory of 14
    # turns reached ~1,900 (past the cache, so every episode was truncated) and made the train
    # step quadratic in it; the base (experiments/rooms_fee/base.py) is fitted to these same rows.
    c.rollout.representation = "stepwise"
    c.rollout.history_window = 0
    c.rollout.max_len = 512
    c.rollout.enable_thinking = False
    c.envs.train = "rooms"
    c.envs.eval = "rooms:test:16"
    c.envs.num_workers = 0
    c.feedback.schedule = "ag_early_oe_late"
    c.feedback.switch_step = 30
    c.eval.every = 10
    c.eval.max_turns = 14
    c.eval.at_start = False
    c.checkpoint.every = 20
    return c
