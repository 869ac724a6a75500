"""Declared contrasts: the study file's declaration checked, each contrast's numbers and the
Holm family in the report, the committed fifth FEE rooms run re-reported (its numbers by hand),
and a study's missing base model (built by its seeded commands, or a one-line error)."""

import json
import math
import os
import subprocess
import sys

import pytest

from jaxscaffold.studies import report, runner, stats

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs", "studies")


def _study(tmp_path, **extra):
    d = {"name": "t", "out_dir": str(tmp_path / "out"), "seeds": [0, 1, 2, 3, 4],
         "arms": {"a": ("tiny.py", []), "b": ("tiny.py", []), "c": ("tiny.py", [])}, "baseline": "b", **extra}
    path = tmp_path / "study.py"
    path.write_text(f"def get_study():\n    return {d!r}\n")
    return runner.load_study(str(path))


def test_contrast_declarations_are_checked(tmp_path):
    s = _study(tmp_path, primary="auc", contrasts=[{"a": "a", "b": "c", "metric": "score", "step": 10},
                                                   {"a": "c", "b": "b", "metric": "peak", "exploratory": True}])
    assert s.primary == "auc" and [c.name for c in s.contrasts] == ["a - c: score@10", "c - b: peak"]
    for bad, match in (([{"a": "a", "b": "x", "metric": "final"}], "not an arm"),
                       ([{"a": "a", "b": "b", "metric": "mean"}], "metric"),
                       ([{"a": "a", "b": "b", "metric": "score"}], "needs a 'step'"),
                       ([{"a": "a", "b": "b", "metric": "final", "side": 1}], "unknown keys")):
        with pytest.raises(runner.StudyError, match=match):
            _study(tmp_path, contrasts=bad)
    with pytest.raises(runner.StudyError, match="primary"):
        _study(tmp_path, primary="best")
    with pytest.raises(runner.StudyError, match="commands"):
        _study(tmp_path, base={"path": "x", "commands": "experiments/rooms_fee/base.py x"})


def test_contrast_table_holm_family_and_curves(tmp_path):
    s = _study(tmp_path, contrasts=[{"a": "a", "b": "b", "metric": "final"},
                                    {"a": "c", "b": "b", "metric": "auc"},
                                    {"a": "a", "b": "c", "metric": "score", "step": 10, "exploratory": True}])
    def run(scores):  # eval at steps 0, 10, 20
        return stats.summarise_run([{"step": st, "eval/score": v} for st, v in zip((0, 10, 20), scores)],
                                   score="eval/score")
    runs = {"a": {i: run([0, 0.1 + i / 64, 0.2 + i / 64]) for i in range(5)},
            "b": {i: run([0, 0.1, 0.1]) for i in range(5)},
            "c": {i: run([0, 0.2, 0.1 - i / 64]) for i in range(5)}}
    rows = report.contrast_table(runs, s.contrasts)
    first, second, third = rows
    assert first["diffs"] == pytest.approx([0.1 + i / 64 for i in range(5)]) and first["p"] == 2 / 32
    # auc over steps 0-20 = (0 + 2 * v10 + v20) / 4 by the trapezoid rule
    assert second["diffs"] == pytest.approx([((2 * 0.2 + 0.1 - i / 64) - (2 * 0.1 + 0.1)) / 4 for i in range(5)])
    assert third["step"] == 10 and third["diffs"] == pytest.approx([i / 64 - 0.1 for i in range(5)])
    assert third["p_holm"] is None  # exploratory: outside the family of two
    assert [first["p_holm"], second["p_holm"]] == pytest.approx(stats.holm([first["p"], second["p"]]))
    assert runs["c"][4]["eval_variability"] == pytest.approx((0.2 + 0.1 + 4 / 64) / 2)


def test_the_fifth_fee_rooms_run_re_reported():
    """The committed study.json with the study file's contrasts: FEE's step-20 gain is
    (0, 2, 2, 4, 1) successes of 64, sign-flip p = 4/32; fee - ag_only -0.0125; Holm over the
    declared family leaves nothing below 0.05 (5 seeds cannot: p >= 0.0625)."""
    study = runner.load_study(os.path.join(ROOT, "experiments", "rooms_fee", "study.py"))
    with open(os.path.join(DOCS, "fee_rooms_run5.json")) as f:
        committed = json.load(f)
    with open(os.path.join(DOCS, "fee_rooms_run5_scores.json")) as f:
        scores = json.load(f)
    rows = {c["name"]: c for c in report.rereport(study, committed, scores)["contrasts"]}
    fee = rows["fee - standard: final"]
    assert [round(d * 64) for d in fee["diffs"]] == [0, 2, 2, 4, 1] and fee["p"] == 0.125
    assert rows["fee - ag_only: final"]["mean"] == pytest.approx(-0.0125)
    assert rows["fee - standard: score@10"]["n"] == 5 and rows["fee - fee_random: final"]["p_holm"] is None
    assert all(c["p_holm"] >= 0.0625 for c in rows.values() if c["p_holm"] is not None)
    # the transcribed step-10 scores agree with the JSON's peaks (peak = max of steps 10, 20)
    for arm, by_seed in scores["arms"].items():
        for seed, points in by_seed.items():
            assert max(points.values()) == pytest.approx(committed["arms"][arm]["runs"][seed]["peak"])
    scores["arms"]["fee"]["0"]["20"] = 0.5
    with pytest.raises(ValueError, match="final"):
        report.rereport(study, committed, scores)


def _base_study(tmp_path, command):
    path = tmp_path / "study.py"
    base = {"path": str(tmp_path / "base"), "commands": [command], "recipe": "a test's"}
    path.write_text("def get_study():\n    return " + repr({"name": "b", "out_dir": str(tmp_path / "out"),
                                                          "seeds": [0], "arms": {"a": ("tiny.py", [])},
                                                          "base": base}) + "\n")
    return str(path)


def test_a_missing_base_is_an_error_or_built(tmp_path):
    maker = tmp_path / "make_base.py"  # stands in for experiments/rooms_fee/base.py: writes the HF dir's config.json
    maker.write_text("import os, sys\nos.makedirs(sys.argv[1], exist_ok=True)\n"
                     "open(os.path.join(sys.argv[1], 'config.json'), 'w').write('{}')\n")
    study_file = _base_study(tmp_path, [str(maker), str(tmp_path / "base")])
    cmd = [sys.executable, os.path.join(ROOT, "launch", "study.py"), "--study", study_file]
    env = {**os.environ, "PYTHONPATH": ROOT}
    refused = subprocess.run([*cmd, "--no-build-base"], capture_output=True, text=True, env=env, check=False)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "no base model" in refused.stderr and str(maker) in refused.stderr
    built = subprocess.run([*cmd, "--base-only"], capture_output=True, text=True, env=env, check=False)
    assert built.returncode == 0 and "building it (a test's)" in built.stdout
    assert os.path.isfile(tmp_path / "base" / "config.json")
    again = subprocess.run([*cmd, "--base-only"], capture_output=True, text=True, env=env, check=False)
    assert again.returncode == 0 and "building" not in again.stdout and "base model at" in again.stdout


def test_a_failing_base_command_is_one_line(tmp_path):
    failing = tmp_path / "fail.py"
    failing.write_text("raise SystemExit(3)\n")
    study = runner.load_study(_base_study(tmp_path, [str(failing)]))
    with pytest.raises(runner.StudyError, match="exit 3"):
        runner.ensure_base(study, ROOT, say=lambda _: None)


def test_the_rooms_studies_name_their_bases_seeded_recipe():
    for name, script in (("rooms_fee", "experiments/rooms_fee/base.py"), ("rooms_rwml", "experiments/rooms_rwml/base.py")):
        study = runner.load_study(os.path.join(ROOT, "experiments", name, "study.py"))
        commands = study.base["commands"]
        assert commands[-1][0] == script and all("--seed" in c for c in commands) and "seed" in study.base["recipe"]
        for command in commands:  # every flag the recipe passes is one its script takes
            usage = subprocess.run([sys.executable, os.path.join(ROOT, command[0]), "--help"], capture_output=True,
                                   text=True, env={**os.environ, "PYTHONPATH": ROOT}, check=False).stdout
            assert all(f in usage for f in command if f.startswith("--")), (command, usage)
        assert not math.isnan(len(study.contrasts)) and study.contrasts and study.primary == "final"


def test_the_confirmatory_replication_runs_what_it_registers():
    """fee_rooms_confirm.py: >= 10 seeds none of the other committed studies used; the four
    arms; evaluation every 2 steps on all 64 test layouts; H1-H4 the only confirmatory contrasts."""
    study = runner.load_study(os.path.join(ROOT, "experiments", "rooms_fee", "confirm.py"))
    used = set()
    for name in os.listdir(DOCS):
        if name.endswith(".json") and name != "fee_rooms_confirm.json":  # its own report
            with open(os.path.join(DOCS, name)) as f:
                used |= set(json.load(f).get("seeds", []))
    assert len(study.seeds) >= 10 and not used & set(study.seeds)
    assert set(study.arms) == {"standard", "fee", "fee_random", "ag_only"}
    cfg = runner.stage_configs(study, "fee_random", study.seeds[0], os.path.join(ROOT, "configs"))[0]
    assert (cfg.eval.every, cfg.envs.eval, cfg.steps, cfg.feedback.mode) == (2, "rooms:test:64", 20, "even")
    family = [c.name for c in study.contrasts if not c.exploratory]
    assert family == ["fee - standard: final", "fee - fee_random: final", "fee_random - fee: eval_variability",
                      "fee - ag_only: final"]
