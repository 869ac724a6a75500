"""Resuming a run: the recorded config (out_dir/config.json) and the changes a resume may make."""

import json

import pytest

from jaxscaffold import config as config_lib
from jaxscaffold.config import ConfigError
from jaxscaffold.train import resume
from tests.train.configs import tiny_config


def _recorded_run(tmp_path, **overrides):
    """An out_dir as a run leaves it: config.json and a finished checkpoint step's directory."""
    cfg = config_lib.typed(tiny_config(tmp_path, **overrides))
    resume.write_config(cfg)
    (tmp_path / "checkpoints" / "3").mkdir(parents=True)
    return cfg


def test_a_changed_field_is_refused_naming_old_and_new_unless_allowed(tmp_path):
    old = _recorded_run(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text()) == old.to_dict()
    new = config_lib.replace(old, **{"rl.lr": 0.01, "rollout.temperature": 0.7})
    with pytest.raises(ConfigError, match=r"changes rl.lr 0.03 -> 0.01, rollout.temperature 1.0 -> 0.7 .*"
                                          r"--config.checkpoint.allow_change=rl.lr,rollout.temperature \(else"):
        resume.check_resume(new)
    half = config_lib.replace(new, **{"checkpoint.allow_change": "rl.lr"})
    with pytest.raises(ConfigError, match=r"changes rollout.temperature 1.0 -> 0.7 .*allow_change=rl.lr,rollout.temperature \(") as e:
        resume.check_resume(half)
    assert "\n" not in str(e.value)
    both = config_lib.replace(new, **{"checkpoint.allow_change": "rl.lr, rollout.temperature"})
    assert resume.check_resume(both) == {"rl.lr": (0.03, 0.01), "rollout.temperature": (1.0, 0.7)}


def test_execution_fields_change_freely_and_a_fresh_run_checks_nothing(tmp_path):
    old = _recorded_run(tmp_path)
    free = config_lib.replace(old, **{"steps": 99, "envs.num_workers": 3, "mesh.devices": 2, "checkpoint.keep": 1,
                                      "logging.verbose": True})
    assert resume.check_resume(free) == {}
    assert resume.check_resume(config_lib.replace(free, out_dir=str(tmp_path / "other"))) == {}  # no run there
    (tmp_path / "checkpoints" / "3").rmdir()  # config.json but no checkpoint: the run starts afresh
    assert resume.check_resume(config_lib.replace(old, **{"rl.lr": 0.5})) == {}


def test_the_model_cannot_change_even_when_allowed(tmp_path):
    old = _recorded_run(tmp_path)
    new = config_lib.replace(old, **{"model.preset": "qwen3-0.6b", "checkpoint.allow_change": "model.preset"})
    with pytest.raises(ConfigError, match=r"model.preset 'tiny' -> 'qwen3-0.6b' cannot change .*new out_dir"):
        resume.check_resume(new)


def test_fields_added_since_the_run_are_not_changes():
    old = {"rl": {"lr": 1.0}, "gone": 1, "rwml": None}
    new = {"rl": {"lr": 1.0, "new_field": 2}, "rwml": {"tau_d": 0.5}}
    assert resume.changed_fields(old, new) == {}
    assert resume.changed_fields({"rl": {"lr": 1.0}}, {"rl": {"lr": 2.0}}) == {"rl.lr": (1.0, 2.0)}


def test_allow_change_must_name_config_fields(tmp_path):
    with pytest.raises(ConfigError, match=r"allow_change: 'rl.lrr' is not a config field \(did you mean rl.lr\?\)"):
        config_lib.typed(tiny_config(tmp_path, **{"checkpoint.allow_change": "rl.lrr"}))


def test_unreadable_config_json_is_a_one_line_error(tmp_path):
    old = _recorded_run(tmp_path)
    (tmp_path / "config.json").write_text("{broken")
    with pytest.raises(ConfigError, match="config.json is unreadable"):
        resume.check_resume(old)


def test_train_refuses_a_changed_model_before_building_and_records_an_allowed_change(tmp_path, monkeypatch):
    """End to end: the run writes its resolved config; a resume with another model stops before
    anything is built; an allowed learning-rate change resumes and is recorded."""
    from jaxscaffold.train import trainer
    # On the word vocabulary: the recorded config and its checks do not depend on Qwen3's.
    cfg = lambda steps, **o: tiny_config(tmp_path, steps=steps, words=True, **{"eval.every": 0, "checkpoint.every": 1, **o})
    trainer.train(cfg(1))
    assert json.loads((tmp_path / "config.json").read_text()) == config_lib.typed(cfg(1)).to_dict()
    with monkeypatch.context() as m:
        m.setattr(trainer, "build_job", lambda c: pytest.fail("built the model before refusing"))
        with pytest.raises(ConfigError, match="model.preset 'tiny' -> 'qwen3-0.6b' cannot change"):
            trainer.train(cfg(2, **{"model.preset": "qwen3-0.6b"}))
        with pytest.raises(ConfigError, match="rl.lr 0.03 -> 0.01"):
            trainer.train(cfg(2, **{"rl.lr": 0.01}))
    out = trainer.train(cfg(2, **{"rl.lr": 0.01, "checkpoint.allow_change": "rl.lr"}))
    assert [h["step"] for h in out["history"]] == [1, 2]
    assert json.loads((tmp_path / "config.json").read_text())["rl"]["lr"] == 0.01
