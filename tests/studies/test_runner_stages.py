"""Two-stage arms (RWML, then policy RL): stage 2 starts from stage 1's export with the same
seed, each stage is checked before any run, and a study resumed after stage 1 finished does
not repeat it."""

import json
import os

import pytest

from jaxscaffold.studies import report, runner

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "configs")


def _study(tmp_path, arms):
    path = tmp_path / "study.py"
    path.write_text(f"def get_study():\n    return {{'name': 't', 'out_dir': {str(tmp_path / 'out')!r}, "
                    f"'seeds': [0, 1], 'score': 'eval/score', 'baseline': 'policy', 'arms': {arms!r}}}\n")
    return runner.load_study(str(path))


ARMS = {"policy": ("rwml_policy_rooms.py", ["model.hf_path=/base"]),
        "wm": ("rwml_rooms.py", ["model.hf_path=/base"], ("rwml_policy_rooms.py", ["steps=3"]))}


def _history(cfg):
    score = 0.5 if cfg.job == "rl" and cfg.model.hf_path != "/base" else 0.25
    return [{"step": 1, "eval/score": score + 0.01 * cfg.seed, "rollout/reward": 0.0}]


def test_the_second_stage_starts_from_the_first_stages_export(tmp_path):
    study = _study(tmp_path, ARMS)
    calls = []
    runner.run_study(study, CONFIGS, train=lambda cfg: calls.append(cfg) or _history(cfg))
    wm = [c for c in calls if c.out_dir.startswith(study.run_dir("wm", 0))]
    assert [c.job for c in wm] == ["rwml", "rl"]  # stage 1 first
    first, second = wm
    assert first.out_dir == os.path.join(study.run_dir("wm", 0), "stage1")
    assert second.out_dir == study.run_dir("wm", 0) and second.steps == 3
    assert second.model.hf_path == os.path.join(first.out_dir, "hf") == runner.export_dir(first)
    assert first.seed == second.seed == 0 and first.model.hf_path == "/base"
    record = json.load(open(os.path.join(study.run_dir("wm", 1), runner.RUN_FILE)))
    assert record["history"][0]["eval/score"] == pytest.approx(0.51)  # the arm's score: stage 2's
    assert record["stage1_history"][0]["eval/score"] == pytest.approx(0.26)
    summary = report.write_report(study)
    assert summary["paired_vs_baseline"]["wm"]["final"]["mean"] == pytest.approx(0.25)


def test_a_finished_first_stage_is_not_repeated(tmp_path):
    study = _study(tmp_path, ARMS)
    calls = []

    def crash_in_stage_2(cfg):
        calls.append((cfg.job, cfg.out_dir))
        if cfg.job == "rl" and cfg.model.hf_path != "/base":
            raise RuntimeError("killed")
        return _history(cfg)
    with pytest.raises(RuntimeError):
        runner.run_study(study, CONFIGS, train=crash_in_stage_2)
    assert calls[-2:] == [("rwml", os.path.join(study.run_dir("wm", 0), "stage1")), ("rl", study.run_dir("wm", 0))]
    again = []
    runner.run_study(study, CONFIGS, train=lambda cfg: again.append((cfg.job, cfg.out_dir)) or _history(cfg))
    assert ("rl", study.run_dir("wm", 0)) in again
    assert ("rwml", os.path.join(study.run_dir("wm", 0), "stage1")) not in again  # stage 1 had finished
    assert runner.run_study(study, CONFIGS, train=lambda cfg: pytest.fail("a run restarted")) == []


def test_bad_stages_are_found_before_any_run(tmp_path):
    bad_second = {**ARMS, "wm": ("rwml_rooms.py", [], ("rwml_policy_rooms.py", ["rl.algorithm=ppo"]))}
    with pytest.raises(Exception, match="arm wm: .*not one of"):
        runner.run_study(_study(tmp_path, bad_second), CONFIGS, train=lambda cfg: pytest.fail("a run started"))
    no_export = {**ARMS, "wm": ("rwml_policy_rooms.py", [], ("rwml_policy_rooms.py", []))}
    with pytest.raises(runner.StudyError, match="must export"):
        runner.run_study(_study(tmp_path, no_export), CONFIGS, train=lambda cfg: pytest.fail("a run started"))
    exported = {**ARMS, "wm": ("rwml_policy_rooms.py", ["export.at_end=true", "export.dir=/x"],
                              ("rwml_policy_rooms.py", []))}
    assert runner.stage_configs(_study(tmp_path, exported), "wm", 0, CONFIGS)[1].model.hf_path == "/x"
    with pytest.raises(runner.StudyError, match="must be"):
        _study(tmp_path, {"policy": ("rwml_rooms.py", [], ("x.py",))})


def test_the_rooms_study_file_loads_and_every_stage_checks():
    study = runner.load_study(os.path.join(ROOT, "experiments", "rooms_rwml", "study.py"))
    assert set(study.arms) == {"policy_rl", "rwml", "wm_sft"} and len(study.seeds) >= 5
    assert set(study.then) == {"rwml", "wm_sft"} and study.baseline == "policy_rl"
    stages = {arm: runner.stage_configs(study, arm, 0, CONFIGS) for arm in study.arms}
    assert [c.job for c in stages["rwml"]] == ["rwml", "rl"] and stages["rwml"][0].rwml.objective == "rl"
    assert stages["wm_sft"][0].rwml.objective == "sft"
    policies = [stages["policy_rl"][0], stages["rwml"][1], stages["wm_sft"][1]]
    # The arms differ only in where the policy stage starts.
    assert len({(c.steps, c.rl, c.rollout, c.feedback, c.model.vocabulary) for c in policies}) == 1
    assert policies[0].model.hf_path == stages["rwml"][0].model.hf_path == stages["wm_sft"][0].model.hf_path
