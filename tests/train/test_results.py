"""Peak and final of every evaluation metric, results.json, and the step-0 evaluation of a run."""

import json

import pytest

from jaxscaffold.train.results import peak_and_final, running_peaks, write_results
from jaxscaffold.train.trainer import train
from tests.train.configs import tiny_config

HISTORY = [{"step": 0, "eval/score": 0.2, "eval/success_bfcl": 0.5},
           {"step": 1, "rollout/reward": 0.9},
           {"step": 2, "eval/score": 0.4, "eval/success_bfcl": 0.25, "eval/score_peak": 0.4},
           {"step": 4, "eval/score": 0.4, "eval/success_bfcl": 0.0, "eval/score_peak": 0.4, "eval/note": "x"}]


def test_peak_and_final_of_every_eval_metric():
    assert peak_and_final(HISTORY) == {
        "eval/score": {"peak": 0.4, "peak_step": 2, "final": 0.4, "final_step": 4, "evaluations": 3},
        "eval/success_bfcl": {"peak": 0.5, "peak_step": 0, "final": 0.0, "final_step": 4, "evaluations": 3}}
    assert running_peaks(HISTORY, {"eval/score": 0.3, "eval/success": 0.9}) == {
        "eval/score_peak": 0.4, "eval/success_peak": 0.9}


def test_results_json_is_written_whole(tmp_path):
    path = write_results(str(tmp_path), HISTORY, total_steps=10)
    assert json.load(open(path)) == {"step": 4, "total_steps": 10, "eval": peak_and_final(HISTORY)}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temporary left


def test_run_evaluates_at_step_0_and_leaves_results(tmp_path):
    """Two letters steps with an evaluation before training and at step 2: the history, the
    metrics log and results.json hold the step-0 row, and results.json's peaks and finals are
    those of the history; resumed, the run goes on without evaluating step 0 again."""
    # On the word vocabulary: the evaluation's bookkeeping does not depend on Qwen3's.
    hist = train(tiny_config(tmp_path, steps=2, words=True, **{"eval.every": 2, "eval.at_start": True,
                                                    "checkpoint.every": 2}))["history"]
    assert [h["step"] for h in hist] == [0, 1, 2]
    assert {"eval/score", "eval/success_letters", "eval/score_peak"} <= hist[0].keys() and "train/loss" not in hist[0]
    assert hist[2]["eval/score_peak"] == max(hist[0]["eval/score"], hist[2]["eval/score"])
    assert hist[0]["eval/score"] == pytest.approx(hist[0]["eval/success_letters"])  # one env: its success
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2]
    res = json.load(open(tmp_path / "results.json"))
    assert res["step"] == 2 and res["total_steps"] == 2
    for key in ("eval/score", "eval/success_letters", "eval/reward"):
        values = [h[key] for h in hist if key in h]
        assert res["eval"][key]["final"] == values[-1] and res["eval"][key]["peak"] == max(values), key
        assert res["eval"][key]["final_step"] == 2 and res["eval"][key]["evaluations"] == 2
    # Resumed (from the step-2 checkpoint): no second step-0 evaluation, and step 0 stays logged.
    again = train(tiny_config(tmp_path, steps=4, words=True, **{"eval.every": 2, "eval.at_start": True,
                                                     "checkpoint.every": 2}))["history"]
    assert [h["step"] for h in again] == [0, 1, 2, 3, 4] and again[:3] == hist
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3, 4]
    assert json.load(open(tmp_path / "results.json"))["eval"]["eval/score"]["evaluations"] == 3
