"""Feedback-enriched environments (FEE): which feedback an episode gets, when, and how.

`schedule` says which kind (action guidance AG, observation enhancement OE) is active at a
(training step, episode step); `randomization` decides, per GRPO group, whether the group
gets it; `bandit` learns the schedule instead of fixing it. The enrichers that rewrite
observations live next to them and are applied by the environment pool.
"""
