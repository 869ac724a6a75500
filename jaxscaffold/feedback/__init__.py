"""Feedback-enriched environments (FEE): which feedback an episode gets, when, and how.

`schedule` says which kind (action guidance AG, observation enhancement OE) is active at a
(training step, episode step); `units` says what a window counts per env (ScienceWorld:
actions taken; BFCL: user turns for AG, every tool result for OE); `randomization` decides,
per GRPO group, whether the group gets it; `bandit` learns the schedule instead of fixing it.
`enrichers` rewrite an observation from the env's privileged state (`bfcl_oe`: BFCL's
per-class rules, run inside the env through its `oe_transform` hook; `sciworld_ag`: the
ScienceWorld AG guide, run inside the env through its `ag_guide` hook, whose hints are valid
actions of the current state); `apply.Feedback` puts them together into the text the agent
is shown and hands each episode's plan to its env at reset.
"""
