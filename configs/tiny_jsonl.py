"""The tiny model on your own prompts (the README's "Adding an environment"): configs/tiny.py
trained and evaluated on the JSONL tasks of `my_tasks.jsonl` (in the directory the launcher runs
from), in its own out_dir so it runs before or after the demo without resuming the demo's run.

  PYTHONPATH=. python launch/tpu_train.py --config tiny_jsonl.py \
    --config.envs.env_kwargs='{"jsonl": {"reward": "myrewards:first_number_or_words"}}'
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import tiny  # noqa: E402


def get_config():
    c = tiny.get_config()
    c.out_dir = "runs/tiny_jsonl"
    c.envs.train = "jsonl:my_tasks.jsonl"
    c.envs.eval = "jsonl:my_tasks.jsonl"
    return c
