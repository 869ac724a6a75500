"""FEE as the public reference code runs it (EnvAsScaffold on verl-agent), not as the paper
describes it: step-wise rows (each env step a training row whose prompt is rebuilt with a
2-step history window), the reference's AG (first three gold actions, `[Caution!]`) and OE
(raw goal-progress text), its window bounds (AG steps 0-3 up to training step 100, OE 6-10
after), "probability 0.5" as the first half of the groups (ScienceWorld's rule), and group
statistics over every step row (verl-agent counts each row in its group's mean and std)."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import fee  # noqa: E402


def get_config():
    c = fee.get_config()
    c.out_dir = "runs/fee_reference"
    c.rollout.representation = "stepwise"
    c.rollout.history_window = 2
    c.rollout.max_len = 8192  # the reference's prompt 8192 (a rebuilt prompt stays bounded)
    c.rl.group_stats = "row"  # verl-agent: every step row counts in its group's mean and std
    c.feedback.schedule = "ag_early_oe_late_reference"
    c.feedback.ag_form = "reference"
    c.feedback.oe_form = "reference"
    c.feedback.mode = "first_half"
    return c
