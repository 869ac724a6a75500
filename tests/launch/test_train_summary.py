"""`launch/tpu_train.py`'s last line: what the run learned, as each headline eval metric from
its first evaluation (step 0 of a fresh run: before training) to its last."""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def summary_line(history, out_dir):
    spec = importlib.util.spec_from_file_location("launch_tpu_train", os.path.join(ROOT, "launch", "tpu_train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.summary_line(history, out_dir)


def test_one_env_reads_as_its_success_before_and_after():
    history = [{"step": 0, "eval/score": 0.0, "eval/success_letters": 0.0, "eval/success": 0.0}]
    history += [{"step": s, "rollout/reward": 0.1 * s} for s in (1, 2, 3)]
    history[-1].update({"eval/score": 0.875, "eval/success_letters": 0.875, "eval/success": 0.875})
    line = summary_line(history, "runs/tiny")
    assert line == ("[done] step 3; last train reward 0.300; eval success on letters 0.000 (step 0) -> 0.875 "
                    "(step 3); curves in runs/tiny/curves.png, eval peaks and finals in runs/tiny/results.json")


def test_several_envs_show_the_score_and_each_env():
    history = [{"step": 0, "eval/score": 0.25, "eval/success_letters": 0.5, "eval/success_sciworld": 0.0},
               {"step": 5, "rollout/reward": 0.2, "eval/score": 0.5, "eval/success_letters": 1.0,
                "eval/success_sciworld": 0.0}]
    line = summary_line(history, "out")
    assert ("eval score 0.250 (step 0) -> 0.500 (step 5), success on letters 0.500 (step 0) -> 1.000 (step 5), "
            "success on sciworld 0.000 (step 0) -> 0.000 (step 5);") in line


def test_without_evaluations_or_rollouts():
    assert summary_line([{"step": 2, "train/loss": 1.25}], "out") == \
        "[done] step 2; last train loss 1.250; curves in out/curves.png, eval peaks and finals in out/results.json"
    # one evaluation only (eval.at_start off, evaluated at the last step): its value alone
    line = summary_line([{"step": 4, "rollout/reward": 0.5, "eval/success": 0.25}], "out")
    assert "; eval success 0.250;" in line
