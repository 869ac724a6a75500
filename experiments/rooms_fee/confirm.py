"""The confirmatory FEE replication on the rooms testbed, pre-registered in
experiments/rooms_fee/expected.md ("Confirmatory replication"): the fifth run's recipe unchanged, fresh
seeds, evaluation every 2 steps on all 64 test layouts, the four hypotheses' contrasts declared
here with Holm over them. Nothing here is sized by environment variables but the directory.

  ROOMS_CONFIRM_DIR=/path python launch/study.py --study experiments/rooms_fee/confirm.py --base-only
  ROOMS_CONFIRM_DIR=/path python launch/study.py --study experiments/rooms_fee/confirm.py --shard 0/2   # and 1/2
  ROOMS_CONFIRM_DIR=/path python launch/study.py --study experiments/rooms_fee/confirm.py --report

ROOMS_CONFIRM_DIR (default runs/studies/fee_rooms_confirm) holds the base (`base/`, built by
experiments/rooms_fee/base.py's seeded recipe when missing, as study.py's) and the runs.
"""

import os

ROOT = os.environ.get("ROOMS_CONFIRM_DIR", "runs/studies/fee_rooms_confirm")
STEPS, SWITCH, EVAL_EVERY, EVAL_LAYOUTS = 20, 10, 2, 64
# Fresh: the committed rooms studies (docs/studies/*.json) and their pilots used seeds 0-4.
SEEDS = list(range(100, 112))
BASE_SEED = 0  # the base of the fifth run's recipe (it reproduced the fourth's rates to the digit)
BASE_DIR = os.path.join(ROOT, "base")
COMMON = [f"model.hf_path={BASE_DIR}", f"steps={STEPS}", f"feedback.switch_step={SWITCH}",
          f"eval.every={EVAL_EVERY}", f"checkpoint.every={STEPS}", f"envs.eval=rooms:test:{EVAL_LAYOUTS}"]


def get_study():
    def arm(*overrides):
        return ("rooms.py", [*COMMON, *overrides])

    def c(a, b, metric, hypothesis="", step=None, exploratory=False):
        return {"a": a, "b": b, "metric": metric, "step": step, "hypothesis": hypothesis, "exploratory": exploratory}

    return {
        "name": "fee_rooms_confirm",
        "out_dir": os.path.join(ROOT, "runs"),
        "seeds": SEEDS,
        "score": "eval/score",
        "baseline": "standard",
        "primary": "final",
        "base": {"path": BASE_DIR,
                 "commands": [["experiments/rooms_fee/base.py", BASE_DIR, "--steps", "2000", "--batch", "64", "--lr", "3e-3",
                               "--seed", str(BASE_SEED)]],
                 "recipe": f"experiments/rooms_fee/base.py: 2,000 SFT steps x 64 rows, lr 3e-3, hint on 1/2 of turns, "
                           f"always taken; seed {BASE_SEED}"},
        "contrasts": [  # H1-H4: the Holm family; the rest exploratory
            c("fee", "standard", "final", "H1: fee > standard at step 20"),
            c("fee", "fee_random", "final", "H2: fee > fee_random at step 20"),
            c("fee_random", "fee", "eval_variability", "H3: fee_random's eval curve more variable"),
            c("fee", "ag_only", "final", "H4: fee >= ag_only (non-inferior by 1/64)"),
            c("ag_only", "standard", "final", exploratory=True),
            c("fee", "standard", "auc", exploratory=True),
            c("fee", "fee_random", "auc", exploratory=True),
            c("fee", "standard", "score", step=SWITCH, exploratory=True),
            c("fee_random", "fee", "reward_variability", exploratory=True),
            c("fee", "standard", "informative_share", exploratory=True),
        ],
        "arms": {
            "standard": arm("feedback.schedule=none"),
            "fee": arm("feedback.schedule=ag_early_oe_late"),
            "fee_random": arm("feedback.schedule=ag_early_oe_late", "feedback.mode=even"),
            "ag_only": arm("feedback.schedule=ag_early"),
        },
    }
