"""Feedback-enriched environments (FEE): which feedback an episode gets, when, and how.

`schedule` says which kind (action guidance AG, observation enhancement OE) is active at a
(training step, episode step); `randomization` decides, per GRPO group, whether the group
gets it; `bandit` learns the schedule instead of fixing it. `enrichers` rewrite an
observation from the env's privileged state (`bfcl_oe`: BFCL's per-class rules, which run
inside the env through its `oe_transform` hook); `apply.Feedback` puts them together into the
text the agent is shown.
"""
