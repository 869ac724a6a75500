"""RWML stage 2 on the rooms testbed: GRPO on task success (configs/rooms.py's shapes, no
feedback: RWML's policy stage is the standard env) from stage 1's export, on the same
`rooms_wm` words. With `model.hf_path` at the rooms base instead, it is the "policy RL alone"
arm of experiments/rooms_rwml/study.py."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import rooms  # noqa: E402


def get_config():
    c = rooms.get_config()
    c.out_dir = "runs/rwml_rooms/policy"
    c.model.hf_path = "runs/rwml_rooms/stage1/hf"  # stage 1's export (configs/rwml_rooms.py)
    c.model.vocabulary = "rooms_wm"
    c.feedback.schedule = "none"
    return c
