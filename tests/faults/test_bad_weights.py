"""HF weights that would load silently wrong are refused in one line: NaN or inf values, an
integer tensor where a parameter belongs; an unexpected tensor is one warning line."""

from __future__ import annotations

import logging

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxscaffold.models import config as model_configs
from jaxscaffold.models import hf_io, qwen3

NAME = "model.layers.1.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    # a small vocabulary: the checks are on one MLP tensor, the 151,936-row embedding only bytes to copy
    config = model_configs.tiny(vocab_size=512, param_dtype="float32", compute_dtype="float32")
    params = qwen3.init_params(config, jax.random.key(0))
    path = tmp_path_factory.mktemp("hf")
    hf_io.save_pretrained(str(path), config, params)
    return path


def _edited(hf_dir, tmp_path, edit):
    tensors = load_file(str(hf_dir / "model.safetensors"))
    edit(tensors)
    out = tmp_path / "edited"
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text((hf_dir / "config.json").read_text())
    return out


def test_the_clean_directory_loads(hf_dir):
    hf_io.load_pretrained(str(hf_dir))


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_weights_are_refused(hf_dir, tmp_path, value):
    def poison(t):
        t[NAME] = t[NAME].copy()
        t[NAME][3, 5] = value
    path = _edited(hf_dir, tmp_path, poison)
    with pytest.raises(hf_io.CheckpointError, match=r"non-finite values \(NaN or inf\) in 1 parameter\(s\), e\.g\. "
                                                    r"\['layers'\]\['down'\]|non-finite values") as e:
        hf_io.load_pretrained(str(path))
    assert "\n" not in str(e.value) and "layers" in str(e.value)


def test_integer_weights_are_refused_not_cast(hf_dir, tmp_path):
    def to_int(t):
        t[NAME] = np.round(t[NAME] * 100).astype(np.int64)
    path = _edited(hf_dir, tmp_path, to_int)
    with pytest.raises(hf_io.CheckpointError, match=rf"tensor {NAME} is int64 \(a parameter is one of float32") as e:
        hf_io.load_pretrained(str(path))
    assert "\n" not in str(e.value)


def test_an_unexpected_tensor_is_one_warning_line(hf_dir, tmp_path, caplog):
    def extra(t):
        t["model.layers.0.mlp.surprise.weight"] = np.zeros((2, 2), np.float32)
    path = _edited(hf_dir, tmp_path, extra)
    with caplog.at_level(logging.WARNING, logger="jaxscaffold"):
        hf_io.load_pretrained(str(path))
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1 and "surprise" in lines[0] and "not used by the model" in lines[0] and "\n" not in lines[0]
