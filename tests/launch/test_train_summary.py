"""`launch/tpu_train.py`'s last line: what the run learned, as each headline eval metric and the
eval reward from the first evaluation (step 0 of a fresh run: before training) to the last."""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def summary_line(history, out_dir):
    spec = importlib.util.spec_from_file_location("launch_tpu_train", os.path.join(ROOT, "launch", "tpu_train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.summary_line(history, out_dir)


def _evaluation(step, score, **envs):
    return {"step": step, "eval/score": score, "eval/success": score, "eval/reward": score / 2,
            **{f"eval/success_{env}": v for env, v in envs.items()}}


def test_one_env_reads_as_its_success_before_and_after():
    history = [_evaluation(0, 0.0, letters=0.0)] + [{"step": s, "rollout/reward": 0.1 * s} for s in (1, 2, 3)]
    history[-1].update(_evaluation(3, 0.875, letters=0.875))
    assert summary_line(history, "runs/tiny") == (
        "[done] step 3; last train reward 0.300; eval (step 0 -> 3): success on letters 0.000 -> 0.875, "
        "reward 0.000 -> 0.438; curves in runs/tiny/curves.png, eval peaks and finals in runs/tiny/results.json")


def test_several_envs_show_the_score_and_each_env():
    history = [_evaluation(0, 0.25, letters=0.5, sciworld=0.0),
               {"step": 5, "rollout/reward": 0.2, **_evaluation(5, 0.5, letters=1.0, sciworld=0.0)}]
    assert ("; eval (step 0 -> 5): score 0.250 -> 0.500, success on letters 0.500 -> 1.000, success on sciworld "
            "0.000 -> 0.000, reward 0.125 -> 0.250;") in summary_line(history, "out")


def test_without_evaluations_or_with_one():
    assert summary_line([{"step": 2, "train/loss": 1.25}], "out") == \
        "[done] step 2; last train loss 1.250; curves in out/curves.png, eval peaks and finals in out/results.json"
    # one evaluation (eval.at_start off, evaluated at the last step): its values alone
    line = summary_line([{"step": 4, "rollout/reward": 0.5, "eval/success": 0.25, "eval/reward": 0.5}], "out")
    assert "; eval: success 0.250, reward 0.500;" in line
