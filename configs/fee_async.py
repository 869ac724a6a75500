"""FEE on ScienceWorld (`fee_sciworld.py`) with training that overlaps generation: the next
step's rollouts run while this step trains (`rollout.max_staleness = 1`), so each batch after
the first was sampled by the policy one update behind the one it trains.

The correction: the trainer recomputes the old log-probs (as the reference), so the PPO ratio
is taken against the policy being trained, and masked importance sampling drops the tokens
whose ratio pi_old / pi_sampler (one version of drift plus the sampler's numerics) leaves
[0.5, 2] (`rl.mis = "token"`). Everything else is fee_sciworld's. See docs/async_training.md.

Partial rollouts (`--config.rollout.partial=true`) let the running episodes continue under
each newly published version instead of finishing on the one they started with (fresher
tokens, each corrected by its own sampling log-prob; the swap's chunk then depends on timing,
so such a run is not reproducible token for token): off here.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import fee_sciworld  # noqa: E402


def get_config():
    c = fee_sciworld.get_config()
    c.out_dir = "runs/fee_async"
    c.rollout.max_staleness = 1  # step s + 1's rollouts overlap step s's update
    c.rollout.partial = False  # True: running episodes take each newly published version from their next decode chunk
    c.rl.recompute_old_logprobs = True  # the trainer's old log-probs (fee_sciworld's already)
    c.rl.mis = "token"  # mask tokens whose pi_old / pi_sampler leaves [mis_lo, mis_hi]
    c.rl.mis_lo = 0.5
    c.rl.mis_hi = 2.0
    return c
