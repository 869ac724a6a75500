"""The embedded default: the whole loop on CPU in minutes with a tiny random Qwen3 on the
real Qwen3 vocabulary. It trains on the `letters` task, where the reward visibly rises, and
evaluates on letters and on real ScienceWorld and BFCL v3 tasks (a random model scores 0
there: the point is that the real environments run end to end). They are evaluated only:
their prompts (~300-500 tokens for ScienceWorld, ~2.5-3.7k with BFCL's function docs) would
make a train step that contains one about 8x (ScienceWorld) to 64x (BFCL) dearer than a letters step."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import base  # noqa: E402


def get_config():
    c = base.get_config()
    c.out_dir = "runs/tiny"
    c.steps = 30
    c.model.preset = "tiny"  # 2 layers, hidden 64, Qwen3 vocabulary (about 10M parameters)
    c.model.compute_dtype = "float32"
    c.model.cache_dtype = "float32"
    c.model.remat_policy = "none"
    c.rl.lr = 3e-2  # a random tiny model on a one-step task: learns in tens of steps
    c.rollout.tasks_per_step = 4
    c.rollout.group_size = 8
    c.rollout.max_turns = 1
    c.rollout.max_new_tokens = 16
    c.rollout.max_len = 128
    c.rollout.enable_thinking = False
    c.envs.train = "letters"
    c.envs.eval = "letters:test:8,sciworld:test:2,bfcl:validation:2"  # env:split:n tasks (balanced over categories)
    c.envs.num_workers = 1
    c.feedback.schedule = "none"
    c.eval.every = 15  # at 15 the letters reward starts rising, at 30 it has
    c.eval.tasks = 0  # no cap: the counts of envs.eval
    c.eval.batch_size = 2  # eval rows: a BFCL prompt's prefill (4096 bucket) costs ~5 s a row on CPU
    c.eval.max_turns = 1
    c.eval.max_len = 4096  # BFCL's system prompt holds the function docs (up to ~3.7k tokens)
    c.checkpoint.every = 10
    return c
