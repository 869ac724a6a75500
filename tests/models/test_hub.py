"""`model.hf_path` as a hub id: resolved offline from a cache laid out as huggingface_hub lays
it (models--ORG--NAME/refs/main naming a snapshot hash, snapshots/HASH/ holding the files)."""

import os

import huggingface_hub
import numpy as np
import pytest

from jaxscaffold import config as config_lib
from jaxscaffold.models import hf_io, hub
from jaxscaffold.models.hf_io import CheckpointError
from jaxscaffold.train import job
from tests.models.hf_reference import make_hf_model
from tests.train.configs import tiny_config

SNAPSHOT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An offline hub cache holding `tiny-org/tiny-qwen3` (a random transformers Qwen3 saved
    as the hub stores a snapshot) and nothing else."""
    cache = tmp_path / "hub"
    repo = cache / "models--tiny-org--tiny-qwen3"
    snapshot = repo / "snapshots" / SNAPSHOT
    make_hf_model().save_pretrained(snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(SNAPSHOT)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    # huggingface_hub reads HF_HUB_CACHE once, at import: point the imported module at it too
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return snapshot


def test_hub_id_resolves_to_the_cached_snapshot(hub_cache):
    assert os.path.samefile(hub.resolve("tiny-org/tiny-qwen3"), hub_cache)


def test_a_local_directory_is_itself(tmp_path, hub_cache, monkeypatch):
    assert hub.resolve(str(hub_cache)) == str(hub_cache)
    # a directory that happens to look like an id (ORG/NAME, relative) is taken as the directory
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert hub.resolve("org/name") == "org/name"


def test_a_run_loads_the_same_weights_by_id_and_by_directory(tmp_path, hub_cache):
    by_id = config_lib.typed(tiny_config(tmp_path / "a", **{"model.hf_path": "tiny-org/tiny-qwen3"}))
    config, params = job.build_model(by_id, None)
    _, reference = hf_io.load_pretrained(str(hub_cache))
    assert config.num_layers == 2 and config.vocab_size == 320
    assert job.model_config(by_id).hidden_size == config.hidden_size
    np.testing.assert_array_equal(np.asarray(params["embed"]), np.asarray(reference["embed"]))


@pytest.mark.parametrize("name, says", [
    ("tiny-org/not-cached", "no such directory, and no hub model of that id in"),
    ("./no/such/dir", "checkpoint directory not found"),
    ("/no/such/dir", "checkpoint directory not found"),
])
def test_neither_directory_nor_cached_id_is_one_line(hub_cache, name, says):
    with pytest.raises(CheckpointError) as e:
        hub.resolve(name)
    message = str(e.value)
    assert "\n" not in message and says in message and name in message and "model.hf_path" in message
    if "not-cached" in name:
        assert "HF_HUB_OFFLINE" in message and f"hf download {name}" in message
