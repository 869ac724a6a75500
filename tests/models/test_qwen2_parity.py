"""Qwen2.5 (model_type "qwen2": q/k/v biases, no q/k norms) on the same functional model:
logits, gradients, HF export and the CPU decode layout against transformers' PyTorch
Qwen2ForCausalLM built from tiny local configs (random weights, biases included)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from jaxscaffold.backends import cpu
from jaxscaffold.models import config as model_configs
from jaxscaffold.models import hf_io, qwen3
from jaxscaffold.models.hf_io import CheckpointError
from tests.models.hf_reference import hf_logits, make_hf_model
from tests.models.test_qwen3_parity import _assert_close, check_prefill_then_steps

forward = jax.jit(qwen3.forward, static_argnums=1)
cpu_forward = jax.jit(cpu.forward, static_argnums=1, static_argnames=("window",))

CONFIGS = {
    "untied-gqa2": dict(heads=4, kv_heads=2, head_dim=16, tied=False),
    "tied-mha": dict(heads=4, kv_heads=4, head_dim=16, tied=True),
    "three-layers-tied-gqa4": dict(layers=3, heads=4, kv_heads=1, head_dim=16, tied=True),
}


def _load(tmp_path, **kw):
    model = make_hf_model(model_type="qwen2", **kw)
    model.save_pretrained(tmp_path)
    config, params = hf_io.load_pretrained(str(tmp_path))
    return model, config, params


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("seq_len", [1, 33, 100])  # 100: attention in 3 query blocks
def test_logits_match_transformers(tmp_path, name, seq_len):
    model, config, params = _load(tmp_path, **CONFIGS[name])
    assert config.model_type == "qwen2" and config.tie_word_embeddings == CONFIGS[name]["tied"]
    layer = params["layers"]
    assert {"q_bias", "k_bias", "v_bias"} <= set(layer) and not {"q_norm", "k_norm"} & set(layer)
    assert float(jnp.abs(layer["k_bias"]).max()) > 0.1  # the reference's biases are not zero
    tokens = np.random.RandomState(seq_len).randint(0, config.vocab_size, (2, seq_len))
    _assert_close(np.asarray(forward(params, config, jnp.asarray(tokens))), hf_logits(model, tokens))


@pytest.mark.parametrize("kernels", ["portable", "cpu"])
def test_gradients_match_transformers(tmp_path, kernels):
    """Gradients of every parameter, the biases included, equal PyTorch autograd's through
    transformers' Qwen2 (its gradients saved as a checkpoint and read back by our loader)."""
    model, config, params = _load(tmp_path / "model", **CONFIGS["untied-gqa2"])
    config = config.replace(kernels=None if kernels == "portable" else cpu.KERNELS)
    rng = np.random.RandomState(0)
    tokens = rng.randint(0, config.vocab_size, (2, 70))
    weights = rng.randn(2, 70, config.vocab_size).astype(np.float32)
    ours = jax.jit(jax.grad(lambda p: jnp.sum(qwen3.forward(p, config, jnp.asarray(tokens)) * weights)))(params)
    model.zero_grad()
    (model(input_ids=torch.as_tensor(tokens)).logits * torch.as_tensor(weights)).sum().backward()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.grad)
    model.save_pretrained(tmp_path / "grads")
    _, ref = hf_io.load_pretrained(str(tmp_path / "grads"))
    assert jax.tree.structure(ours) == jax.tree.structure(ref)
    for path, a, b in zip(jax.tree_util.tree_flatten_with_path(ref)[0], jax.tree.leaves(ref), jax.tree.leaves(ours)):
        scale = float(np.max(np.abs(np.asarray(a))))
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=2e-4 * scale, err_msg=str(path[0]))


@pytest.mark.parametrize("tied", [False, True])
def test_export_round_trip_is_bitwise_in_f32(tmp_path, tied):
    """Load, save, and transformers reads back a Qwen2ForCausalLM with the same tensors and
    logits; config.json says qwen2."""
    model = make_hf_model(model_type="qwen2", tied=tied)
    src, dst = tmp_path / "src", tmp_path / "dst"
    model.save_pretrained(src)
    config, params = hf_io.load_pretrained(str(src))
    hf_io.save_pretrained(str(dst), config, params)
    hf = json.loads((dst / "config.json").read_text())
    assert hf["model_type"] == "qwen2" and hf["architectures"] == ["Qwen2ForCausalLM"]
    reloaded = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32).eval()
    assert type(reloaded).__name__ == "Qwen2ForCausalLM"
    assert set(reloaded.state_dict()) == set(model.state_dict())
    for name, p in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], p), name
    tokens = np.random.RandomState(0).randint(0, config.vocab_size, (2, 13))
    np.testing.assert_array_equal(hf_logits(reloaded, tokens), hf_logits(model, tokens))


def test_bf16_compute_is_close_in_kl(tmp_path, capsys):
    """bf16 compute on f32 master weights (biases added in bf16) vs the f32 reference: the
    Qwen3 bound, mean per-token KL(ref || ours) below 1e-3 nats."""
    model, config, params = _load(tmp_path, std=0.1)
    tokens = np.random.RandomState(0).randint(0, config.vocab_size, (4, 32))
    logp_ref = jax.nn.log_softmax(hf_logits(model, tokens), -1)
    logp = jax.nn.log_softmax(np.asarray(forward(params, config.replace(compute_dtype="bfloat16"), jnp.asarray(tokens))), -1)
    kl = float(jnp.mean(jnp.sum(jnp.exp(logp_ref) * (logp_ref - logp), -1)))
    with capsys.disabled():
        print(f"\n[parity] qwen2 bf16 compute vs f32 transformers: mean per-token KL {kl:.2e} nats")
    assert kl < 1e-3, kl


def test_cpu_decode_layout_prefill_then_steps_equal_transformers(tmp_path):
    """The biases survive the CPU decode layout (fused qkv in 2 column blocks, per-layer cache):
    prefill then single-token steps give transformers' logits; so does the stacked cache."""
    model, config, params = _load(tmp_path, heads=4, kv_heads=2)
    fast = cpu.decode_layout(params, config, blocks=2)
    assert len(fast["layers"][0]["qkv"]) == 2 and "q_bias" in fast["layers"][0]
    check_prefill_then_steps(model, config, cpu_forward, fast, cpu.empty_cache(config, 3, 16, dtype="float32"))
    check_prefill_then_steps(model, config, forward, params, qwen3.KVCache.empty(config, 3, 16, dtype="float32"))


def test_random_init_has_the_qwen2_tree_and_its_size():
    """init_params of a qwen2 config: biases, no q/k norms, as many numbers as num_params."""
    config = model_configs.tiny(model_type="qwen2", vocab_size=128)
    params = qwen3.init_params(config, jax.random.key(0))
    assert params["layers"]["q_bias"].shape == (2, config.q_dim) and "q_norm" not in params["layers"]
    assert sum(x.size for x in jax.tree.leaves(params)) == config.num_params()


@pytest.mark.parametrize("name,hf_fields", [
    ("qwen2.5-0.5b", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                          num_key_value_heads=2, tie_word_embeddings=True, vocab_size=151936)),
    ("qwen2.5-7b", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                        num_key_value_heads=4, tie_word_embeddings=False, vocab_size=152064)),
])
def test_presets_have_transformers_parameter_counts(name, hf_fields):
    """A Qwen2.5 preset counts the parameters transformers' Qwen2 of the same config.json has
    (built on the meta device: no memory), and reads back from that config.json."""
    hf_cfg = Qwen2Config(rope_parameters={"rope_type": "default", "rope_theta": 1e6}, max_position_embeddings=32768,
                         **hf_fields)
    with torch.device("meta"):
        n_hf = sum(p.numel() for p in Qwen2ForCausalLM(hf_cfg).parameters())
    ours = model_configs.preset(name)
    assert ours.num_params() == n_hf
    assert hf_io.config_from_hf(hf_cfg.to_dict()) == ours


@pytest.mark.parametrize("change,needle", [
    (dict(use_sliding_window=True), "use_sliding_window"),
    (dict(layer_types=["full_attention", "sliding_attention"]), "layer_types"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}), "RoPE"),
])
def test_unsupported_qwen2_variants_are_refused(tmp_path, change, needle):
    make_hf_model(model_type="qwen2").save_pretrained(tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text()) | change
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(CheckpointError) as e:
        hf_io.load_pretrained(str(tmp_path))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_qwen3_checkpoint_relabelled_qwen2_is_refused(tmp_path):
    """The architecture comes from model_type; a Qwen3 file set read as Qwen2 lacks the biases."""
    make_hf_model().save_pretrained(tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text()) | dict(model_type="qwen2")
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(CheckpointError, match="missing tensor model.layers.0.self_attn.q_proj.bias"):
        hf_io.load_pretrained(str(tmp_path))


def test_bare_qwen2model_loads_and_exports_as_qwen2model(tmp_path):
    """A Qwen2Model checkpoint (no lm_head, no "model." prefix) is read as a backbone: our
    final-normed hidden states equal transformers', and the export reads back as Qwen2Model."""
    from transformers import AutoModel
    model = make_hf_model(model_type="qwen2", embedding=True)
    src, dst = tmp_path / "src", tmp_path / "dst"
    model.save_pretrained(src)
    config, params = hf_io.load_pretrained(str(src))
    assert config.is_embedding and config.model_type == "qwen2" and "lm_head" not in params
    hf_io.save_pretrained(str(dst), config, params)
    reloaded = AutoModel.from_pretrained(dst, dtype=torch.float32).eval()
    assert type(reloaded).__name__ == "Qwen2Model"
    tokens = torch.as_tensor(np.random.RandomState(2).randint(0, config.vocab_size, (2, 6)))
    with torch.no_grad():
        ref = model(input_ids=tokens).last_hidden_state.numpy()
        np.testing.assert_array_equal(reloaded(input_ids=tokens).last_hidden_state.numpy(), ref)
    ours = np.asarray(jax.jit(qwen3.hidden_states, static_argnums=1)(params, config, jnp.asarray(tokens.numpy())))
    np.testing.assert_allclose(ours, ref, atol=1e-4 * max(1, np.abs(ref).max()))
