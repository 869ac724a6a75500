"""FEE on ScienceWorld on ONE Colab TPU chip (v5e-1 / v6e-1: 16 / 32 GB): Qwen3-0.6B with LoRA
(rank 16 on every projection, the base frozen in bf16), 4 tasks x 4 rollouts of up to 8 turns,
3,072-token trajectories, and a switch at step 10 of 20 so both the AG phase (steps 1-10) and
the OE phase (11-20) run within about an hour (time per step unmeasured on a TPU: see the
docs/colab.md). Thinking is off (Qwen3's non-thinking mode): the action format still
asks for a short <think> before each action, which 384 new tokens hold; Qwen3's own
thinking mode reasons for thousands of tokens a turn, past what fits a 16 GB chip's cache.

`launch/plan.py --config colab.py --devices 1 --hbm-gb 16` checks that it fits (measured on fake
devices: peak 10.7 GB in the train phase with 8 micro-batches, 7.8 GB while sampling; 51.6 GB
with one). On CPU:
`--config.model.preset=tiny --config.model.hf_path=` runs the same config with a random tiny
model (what the notebook's test does).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import fee  # noqa: E402


def get_config():
    c = fee.get_config()
    c.out_dir = "runs/colab"
    c.steps = 20
    c.model.preset = "qwen3-0.6b"  # set model.hf_path to the downloaded Qwen/Qwen3-0.6B
    c.model.compute_dtype = "bfloat16"
    c.model.cache_dtype = "bfloat16"
    c.model.remat_policy = "full"
    c.lora.rank = 16
    c.lora.alpha = 32.0
    c.lora.base_dtype = "bfloat16"
    c.rl.lr = 1e-5  # LoRA takes larger steps than full fine-tuning (the paper's 1e-6)
    c.rl.micro_batches = 8  # 2 rows a micro-batch: the train step's temporaries 9.4 GB (launch/plan.py --search)
    c.rollout.tasks_per_step = 4
    c.rollout.group_size = 4
    c.rollout.max_turns = 8
    c.rollout.max_new_tokens = 384
    c.rollout.max_len = 3072
    c.rollout.enable_thinking = False
    c.envs.train = "sciworld"
    c.envs.eval = "sciworld::32"  # 32 test tasks over the task types (about one per type)
    c.envs.num_workers = 4
    c.feedback.switch_step = 10
    c.eval.every = 5
    c.eval.max_turns = 8
    c.eval.max_len = 3072
    c.eval.batch_size = 16
    c.checkpoint.every = 5
    c.mesh.fsdp = 1
    c.mesh.data = -1
    return c
