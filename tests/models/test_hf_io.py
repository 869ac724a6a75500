"""HF checkpoint round trips and the errors for unloadable checkpoints."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, GenerationConfig

from jaxscaffold.models import hf_io, qwen3
from jaxscaffold.models.hf_io import CheckpointError
from jaxscaffold.models.word_tokenizer import WordTokenizer
from tests.models.hf_reference import hf_logits, make_hf_model


@pytest.mark.parametrize("tied", [False, True])
def test_round_trip_is_bitwise_in_f32(tmp_path, tied):
    model = make_hf_model(tied=tied)
    src, dst = tmp_path / "src", tmp_path / "dst"
    model.save_pretrained(src)
    config, params = hf_io.load_pretrained(str(src))
    hf_io.save_pretrained(str(dst), config, params)
    reloaded = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32).eval()
    tokens = np.random.RandomState(0).randint(0, config.vocab_size, (2, 13))
    np.testing.assert_array_equal(hf_logits(reloaded, tokens), hf_logits(model, tokens))
    for name, p in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], p), name


def test_sharded_safetensors_with_index_both_directions(tmp_path):
    model = make_hf_model(layers=3)
    src, dst = tmp_path / "src", tmp_path / "dst"
    model.save_pretrained(src, max_shard_size="100KB")  # transformers writes several shards
    assert (src / "model.safetensors.index.json").exists()
    config, params = hf_io.load_pretrained(str(src))
    hf_io.save_pretrained(str(dst), config, params, max_shard_bytes=100_000)
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    assert len(files) > 1 and all((dst / f).stat().st_size <= 100_000 + 4096 for f in files)
    reloaded = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32).eval()
    tokens = np.random.RandomState(1).randint(0, config.vocab_size, (1, 5))
    np.testing.assert_array_equal(hf_logits(reloaded, tokens), hf_logits(model, tokens))


def test_bf16_checkpoint_loads_and_saves_in_bf16(tmp_path):
    model = make_hf_model(dtype=torch.bfloat16)
    src, dst = tmp_path / "src", tmp_path / "dst"
    model.save_pretrained(src)
    config, params = hf_io.load_pretrained(str(src), dtype="bfloat16")
    assert params["layers"]["q"].dtype == jnp.bfloat16
    hf_io.save_pretrained(str(dst), config, params)
    reloaded = AutoModelForCausalLM.from_pretrained(dst).eval()
    assert reloaded.dtype == torch.bfloat16
    for name, p in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], p), name


def test_transformers_4x_and_5x_config_forms(tmp_path):
    model = make_hf_model()
    model.save_pretrained(tmp_path)
    cfg_path = tmp_path / "config.json"
    hf = json.loads(cfg_path.read_text())
    theta = 10000.0
    four = {k: v for k, v in hf.items() if k != "rope_parameters"} | {"rope_theta": theta}
    five = {k: v for k, v in hf.items() if k != "rope_theta"} | {"rope_parameters": {"rope_type": "default", "rope_theta": theta}}
    for form in (four, five):
        cfg_path.write_text(json.dumps(form))
        config, _ = hf_io.load_pretrained(str(tmp_path))
        assert config.rope_theta == theta


def test_embedding_model_exports_in_qwen3model_layout(tmp_path):
    model = make_hf_model(embedding=True)
    src, dst = tmp_path / "src", tmp_path / "dst"
    model.save_pretrained(src)
    config, params = hf_io.load_pretrained(str(src))
    assert config.is_embedding and "lm_head" not in params
    hf_io.save_pretrained(str(dst), config, params)
    reloaded = AutoModel.from_pretrained(dst, dtype=torch.float32).eval()
    assert type(reloaded).__name__ == "Qwen3Model"
    tokens = torch.as_tensor(np.random.RandomState(2).randint(0, config.vocab_size, (2, 6)))
    with torch.no_grad():
        ref = model(input_ids=tokens).last_hidden_state.numpy()
        again = reloaded(input_ids=tokens).last_hidden_state.numpy()
    np.testing.assert_array_equal(again, ref)
    ours = np.asarray(jax.jit(qwen3.hidden_states, static_argnums=1)(params, config, jnp.asarray(tokens.numpy())))
    np.testing.assert_allclose(ours, ref, atol=1e-4 * max(1, np.abs(ref).max()))


def test_tokenizer_files_are_copied(tmp_path):
    model = make_hf_model()
    model.save_pretrained(tmp_path / "src")
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer_config.json").write_text("{}")
    (tok / "tokenizer.json").write_text("{}")
    config, params = hf_io.load_pretrained(str(tmp_path / "src"))
    hf_io.save_pretrained(str(tmp_path / "dst"), config, params, tokenizer_dir=str(tok))
    assert (tmp_path / "dst" / "tokenizer.json").exists()
    assert (tmp_path / "dst" / "tokenizer_config.json").read_text() == "{}"


# ----------------------------------------------------------------------------- errors


def _one_line(excinfo):
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def test_special_token_ids_follow_the_vocabulary(tmp_path, caplog):
    """The configs (read back by transformers, whose `generate` stops at them) name the given
    tokenizer's ids; Qwen3's only where the vocabulary holds them; ids outside it are refused
    before any file is written."""
    make_hf_model().save_pretrained(tmp_path / "src")  # 320 ids: none of Qwen3's special ids
    config, params = hf_io.load_pretrained(str(tmp_path / "src"))
    with pytest.raises(ValueError, match="outside the model's vocabulary of 320"):
        hf_io.save_pretrained(str(tmp_path / "qwen"), config, params, tokens=hf_io.SpecialTokens())
    assert not (tmp_path / "qwen").exists()

    words = WordTokenizer(["look around the room"])
    hf_io.save_pretrained(str(tmp_path / "words"), config, params, tokens=hf_io.SpecialTokens.of(words))
    end, im_end = words.token_id("<|endoftext|>"), words.token_id("<|im_end|>")
    generation = GenerationConfig.from_pretrained(tmp_path / "words")
    assert generation.eos_token_id == [im_end, end] and generation.pad_token_id == end
    assert AutoConfig.from_pretrained(tmp_path / "words").eos_token_id == im_end

    with caplog.at_level("WARNING"):
        hf_io.save_pretrained(str(tmp_path / "unnamed"), config, params)
    assert "name no bos/eos/pad" in caplog.text
    assert GenerationConfig.from_pretrained(tmp_path / "unnamed").eos_token_id is None
    big = hf_io.config_to_hf(dataclasses.replace(config, vocab_size=151936), "float32")
    assert (big["bos_token_id"], big["eos_token_id"]) == (151643, 151645)  # Qwen3's own config.json


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError) as e:
        hf_io.load_pretrained(str(tmp_path / "nope"))
    assert "not found" in _one_line(e) and "nope" in str(e.value)


def test_missing_tensor(tmp_path):
    from safetensors.torch import load_file, save_file
    make_hf_model().save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as e:
        hf_io.load_pretrained(str(tmp_path))
    assert "missing tensor model.layers.1.mlp.up_proj.weight" in _one_line(e)


def test_shape_mismatch(tmp_path):
    make_hf_model().save_pretrained(tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    hf["intermediate_size"] += 8
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(CheckpointError) as e:
        hf_io.load_pretrained(str(tmp_path))
    assert "has shape" in _one_line(e) and "gate_proj" in str(e.value)


@pytest.mark.parametrize("model_type,arch", [("qwen3_moe", "Qwen3MoeForCausalLM"), ("llama", "LlamaForCausalLM")])
def test_unsupported_architecture(tmp_path, model_type, arch):
    make_hf_model().save_pretrained(tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    hf.update(model_type=model_type, architectures=[arch])
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(CheckpointError) as e:
        hf_io.load_pretrained(str(tmp_path))
    msg = _one_line(e)
    assert "unsupported architecture" in msg and model_type in msg


def test_truncated_file(tmp_path):
    make_hf_model().save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError) as e:
        hf_io.load_pretrained(str(tmp_path))
    assert "truncated" in _one_line(e) or "exceeds" in str(e.value)


def test_parameter_dtype_as_a_name_or_a_dtype(tmp_path):
    make_hf_model().save_pretrained(tmp_path)
    by_name = hf_io.load_pretrained(str(tmp_path), dtype="bfloat16")
    by_object = hf_io.load_pretrained(str(tmp_path), dtype=jnp.bfloat16)
    assert by_name[0] == by_object[0] and by_object[0].param_dtype == "bfloat16"
    assert hf_io.load_pretrained(str(tmp_path), dtype=np.float32)[0].param_dtype == "float32"
    with pytest.raises(CheckpointError) as e:
        hf_io.load_pretrained(str(tmp_path), dtype="int8")
    assert "unsupported parameter dtype" in _one_line(e)


@pytest.mark.parametrize("text, expected", [("{not json", "config.json: unreadable"),
                                            ("[1, 2]", "config.json: a JSON list")])
def test_a_config_json_that_is_not_an_object_names_the_file(tmp_path, text, expected):
    make_hf_model().save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(CheckpointError) as e:
        hf_io.load_pretrained(str(tmp_path))
    assert expected in _one_line(e) and str(tmp_path) in str(e.value)


def _with_header(tmp_path, edit):
    """The tiny checkpoint with its safetensors header rewritten by `edit(header) -> header`."""
    make_hf_model().save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.dumps(edit(json.loads(data[8:8 + n]))).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header + data[8 + n:])


def _first(h):
    return next(k for k in h if k != "__metadata__")


@pytest.mark.parametrize("edit, expected", [
    (lambda h: list(h), "header is a JSON list"),
    (lambda h: {**h, _first(h): "F32"}, "needs dtype, shape and data_offsets"),
    (lambda h: {**h, _first(h): {k: v for k, v in h[_first(h)].items() if k != "shape"}}, "needs dtype"),
    (lambda h: {**h, _first(h): {**h[_first(h)], "shape": "big"}}, "malformed shape"),
    (lambda h: {**h, _first(h): {**h[_first(h)], "data_offsets": [0]}}, "malformed shape or data_offsets"),
    (lambda h: {**h, _first(h): {**h[_first(h)], "dtype": "Q4"}}, "unsupported dtype"),
])
def test_a_malformed_safetensors_header_names_the_file_and_tensor(tmp_path, edit, expected):
    _with_header(tmp_path, edit)
    with pytest.raises(CheckpointError) as e:
        hf_io.load_pretrained(str(tmp_path))
    assert expected in _one_line(e) and "model.safetensors" in str(e.value)


@pytest.mark.parametrize("index", ['{"weight_map": 3}', '[]', '{"metadata": {}}', 'nope'])
def test_a_malformed_index_names_the_file(tmp_path, index):
    make_hf_model().save_pretrained(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(index)
    with pytest.raises(CheckpointError) as e:
        hf_io.load_pretrained(str(tmp_path))
    assert "model.safetensors.index.json: unreadable index" in _one_line(e)
