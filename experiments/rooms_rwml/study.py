"""RWML's comparison on the rooms testbed: policy RL alone, RWML then policy RL, WM-SFT then
policy RL; 5 seeds each, every arm from the same base (experiments/rooms_fee/base.py moved to the
`rooms_wm` words and warmed up on the answer format by experiments/rooms_rwml/base.py), the same stage-2 config (configs/rwml_policy_rooms.py: GRPO on success,
no feedback) and the same number of policy steps.

  policy_rl   stage 2 alone, from the base
  rwml        configs/rwml_rooms.py (world-model GRPO, `lines` reward, difficulty filter), then stage 2
              from its export
  wm_sft      configs/rwml_rooms.py with rwml.objective=sft (cross-entropy on the same triples,
              as many steps), then stage 2 from its export

Expected directions (from the paper) are in experiments/rooms_rwml/expected.md, written before any run.

  D=runs/studies/rwml_rooms
  ROOMS_RWML_DIR=$D python launch/study.py --study rooms_rwml --base-only   # the bases, if missing
  ROOMS_RWML_DIR=$D python launch/study.py --study rooms_rwml [--shard 0/2]
  ROOMS_RWML_DIR=$D python launch/study.py --study rooms_rwml --report

ROOMS_RWML_DIR (default runs/studies/rwml_rooms) holds the bases and the runs;
ROOMS_RWML_WM_STEPS (stage 1, default 40) and ROOMS_RWML_STEPS (stage 2, default 60) size it;
ROOMS_RWML_EVAL_EVERY (default a quarter of stage 2) its evaluations, ROOMS_RWML_EVAL (default
64, all of the test split) their layouts, ROOMS_RWML_SEEDS (default 5) the seeds.
"""

import os

ROOT = os.environ.get("ROOMS_RWML_DIR", "runs/studies/rwml_rooms")
WM_STEPS = int(os.environ.get("ROOMS_RWML_WM_STEPS", "40"))
STEPS = int(os.environ.get("ROOMS_RWML_STEPS", "60"))
SEEDS = int(os.environ.get("ROOMS_RWML_SEEDS", "5"))
BASE = f"model.hf_path={os.path.join(ROOT, 'base')}"
BASE_SEED = 0
# The bases' seeded recipes (launch/study.py builds them when `base/` is missing): the FEE rooms
# base (experiments/rooms_fee/base.py's defaults), then experiments/rooms_rwml/base.py's defaults on it.
BASE_RECIPE = {
    "path": os.path.join(ROOT, "base"),
    "commands": [["experiments/rooms_fee/base.py", os.path.join(ROOT, "base_rooms"), "--steps", "2000", "--batch", "64",
                  "--lr", "3e-3", "--seed", str(BASE_SEED)],
                 ["experiments/rooms_rwml/base.py", os.path.join(ROOT, "base_rooms"), os.path.join(ROOT, "base"),
                  "--warmup-steps", "4000", "--batch", "16", "--lr", "2e-3", "--copy-tasks", "512",
                  "--seed", str(BASE_SEED)]],
    "recipe": f"experiments/rooms_fee/base.py defaults (seed {BASE_SEED}), then experiments/rooms_rwml/base.py defaults "
              f"(4,000 copy warm-up steps, seed {BASE_SEED})",
}
WORLD_MODEL = [BASE, f"steps={WM_STEPS}", f"eval.every={WM_STEPS}", f"checkpoint.every={WM_STEPS}"]
EVAL_EVERY = int(os.environ.get("ROOMS_RWML_EVAL_EVERY", str(max(1, STEPS // 4))))
# All 64 test layouts (greedy): on rooms.py's 16, one success is 6.25 points.
EVAL_LAYOUTS = int(os.environ.get("ROOMS_RWML_EVAL", "64"))
# eval.at_start: step 0 is the policy stage's start, so it shows what stage 1 alone did to the
# policy (the paper's "RWML alone" row) before any task RL.
POLICY = [f"steps={STEPS}", f"eval.every={EVAL_EVERY}", "eval.at_start=true", f"checkpoint.every={STEPS}",
          f"envs.eval=rooms:test:{EVAL_LAYOUTS}"]


def get_study():
    then = ("rwml_policy_rooms.py", POLICY)  # model.hf_path: the first stage's export (the runner sets it)
    return {
        "name": "rwml_rooms",
        "out_dir": os.path.join(ROOT, "runs"),
        "seeds": list(range(SEEDS)),
        "score": "eval/score",
        "baseline": "policy_rl",
        "primary": "final",
        "base": BASE_RECIPE,
        # Declared after runs 1-2, from expected.md's comparisons 1-2.
        "contrasts": [
            {"a": "rwml", "b": "policy_rl", "metric": "final", "hypothesis": "rwml > policy_rl"},
            {"a": "wm_sft", "b": "policy_rl", "metric": "final", "hypothesis": "wm_sft <= policy_rl"},
            {"a": "rwml", "b": "wm_sft", "metric": "final", "hypothesis": "rwml > wm_sft"},
            {"a": "rwml", "b": "policy_rl", "metric": "peak", "hypothesis": "rwml > policy_rl"},
            {"a": "wm_sft", "b": "policy_rl", "metric": "peak", "hypothesis": "wm_sft <= policy_rl"},
        ],
        "arms": {
            "policy_rl": ("rwml_policy_rooms.py", [BASE, *POLICY]),
            "rwml": ("rwml_rooms.py", WORLD_MODEL, then),
            "wm_sft": ("rwml_rooms.py", [*WORLD_MODEL, "rwml.objective=sft"], then),
        },
    }
