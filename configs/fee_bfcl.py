"""FEE on BFCL v3 multi-turn as the reference run trains it: EnvAsScaffold's
`scripts/train.sh bfcl <algorithm> enriched` (see fee_sciworld.py for what both share).

Provenance (EnvAsScaffold `scripts/train.sh`):
- `MAX_STEPS=50` -> `env.max_steps`: the rollout horizon and validation's (ours in fee.py: 15
  and 30); within it at most 20 tool steps per user turn (inside the env, as BFCL);
- `VAL_SIZE=400`: the validation split (ids 100-199 of each of the 4 categories, the
  TradingBot / TravelAPI domains); greedy, every 5 steps;
- "probability 0.5" on BFCL is a per-group seeded coin (`random.Random(seed).random() > 0.5`):
  feedback.mode = "group" (ScienceWorld's first-half rule does not apply);
- 128 step rows per optimizer step, old log-probs from the actor, DAPO continuing after its
  last generation batch: as fee_sciworld.py.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import fee_sciworld  # noqa: E402


def get_config():
    c = fee_sciworld.get_config()
    c.out_dir = "runs/fee_bfcl"
    c.envs.train = "bfcl"
    c.envs.eval = "bfcl:validation"
    c.envs.env_kwargs = ""  # ScienceWorld's simplifications only
    c.rollout.max_turns = 50  # MAX_STEPS=50
    c.eval.max_turns = 50  # validation with the training horizon
    c.eval.tasks = 400  # VAL_SIZE=400
    c.feedback.mode = "group"  # a seeded coin per group
    return c
