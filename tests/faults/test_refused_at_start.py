"""Inputs that used to fail late (a traceback after the model was built) or silently are one
line before the model is built: an unwritable out_dir, more devices than there are, a missing
or broken tokenizer, an empty or oversized JSONL task file, a reward name no code registered."""

from __future__ import annotations

import json
import logging

import pytest

from jaxscaffold.config import ConfigError
from jaxscaffold.train import trainer
from jaxscaffold.train.tasks import TaskSourceError
from tests.train.configs import tiny_config


@pytest.fixture
def built(monkeypatch):
    """Records whether `train` got as far as building the model (it must not)."""
    calls = []
    real = trainer.build_job
    monkeypatch.setattr(trainer, "build_job", lambda cfg: calls.append(cfg) or real(cfg))
    return calls


def refused(cfg, error, match, built):
    with pytest.raises(error, match=match) as e:
        trainer.train(cfg)
    assert "\n" not in str(e.value) and not built
    return e.value


def test_an_unwritable_out_dir(tmp_path, built):
    (tmp_path / "file").write_text("")  # (tests run as root: a directory's mode would not stop a write)
    refused(tiny_config(tmp_path / "file" / "run"), ConfigError, r"config\.out_dir=.*file/run' is not writable", built)


def test_more_devices_than_there_are(tmp_path, built):
    refused(tiny_config(tmp_path, **{"mesh.devices": 9}), ConfigError,
            r"config\.mesh\.devices=9: there are 8 devices \(cpu\)", built)


def test_a_missing_tokenizer_directory(tmp_path, built):
    refused(tiny_config(tmp_path, **{"model.tokenizer": str(tmp_path / "nope")}), ConfigError,
            r"cannot load a tokenizer from .*nope \((FileNotFoundError: tokenizer directory|checkpoint directory) not found", built)


def test_a_broken_tokenizer_json(tmp_path, built):
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "Qwen2TokenizerFast"}))
    (tok / "tokenizer.json").write_text('{"version": "1.0", "model": {')
    refused(tiny_config(tmp_path / "run", **{"model.tokenizer": str(tok)}), ConfigError,
            r"config\.model\.tokenizer: cannot load a tokenizer from .*tok \(", built)


def test_an_empty_jsonl_file(tmp_path, built):
    (tmp_path / "t.jsonl").write_text("\n")
    refused(tiny_config(tmp_path / "run", **{"envs.train": f"jsonl:{tmp_path / 't.jsonl'}"}), TaskSourceError,
            r"t\.jsonl holds no task", built)


def test_a_20_mb_prompt_is_refused_before_tokenising(tmp_path, built):
    (tmp_path / "t.jsonl").write_text(json.dumps({"prompt": "x " * 10_000_000, "answer": "1"}) + "\n")
    refused(tiny_config(tmp_path / "run", **{"envs.eval": f"jsonl:{tmp_path / 't.jsonl'}"}), TaskSourceError,
            r"t\.jsonl:1: a prompt of 20,000,000 characters exceeds 1,000,000", built)


def test_an_unregistered_reward_in_the_config_or_a_line(tmp_path, built):
    (tmp_path / "t.jsonl").write_text('{"prompt": "2+2?", "answer": "4"}\n')
    spec = f"jsonl:{tmp_path / 't.jsonl'}"
    refused(tiny_config(tmp_path / "run", **{"envs.train": spec, "envs.env_kwargs": '{"jsonl": {"reward": "close"}}'}),
            ConfigError, r"config\.envs\.env_kwargs: jsonl reward 'close' is not registered", built)
    refused(tiny_config(tmp_path / "run", **{"envs.train": spec,
                                             "envs.env_kwargs": '{"jsonl": {"reward": "nosuchmodule:f"}}'}),
            ConfigError, r"'nosuchmodule:f' cannot be imported", built)


def test_a_task_without_an_answer_is_one_warning_line(tmp_path, caplog):
    from jaxscaffold.envs import jsonl
    (tmp_path / "t.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b", "answer": "1"}\n{"prompt": "c"}\n')
    with caplog.at_level(logging.WARNING, logger="jaxscaffold"):
        assert len(jsonl.catalogue(str(tmp_path / "t.jsonl"))) == 3
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "2 of 3 tasks have no \"answer\" (e.g. id 1)" in line and "\n" not in line
