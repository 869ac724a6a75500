"""Parity of our model with transformers' PyTorch one on tiny random checkpoints, for each
architecture (`model_type`): Qwen3 (q/k norms) and Qwen2.5 ("qwen2": q/k/v biases, no q/k
norms, random biases included). Logits, gradients, bf16 compute and the KV cache for both;
the rest for the variant whose code path it checks (Qwen2.5's HF export, CPU decode layout,
presets and refusals; Qwen3's padding, packing, remat and attention kernels)."""

import functools
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

forward = jax.jit(qwen3.forward, static_argnums=1)
cpu_forward = jax.jit(cpu.forward, static_argnums=1, static_argnames=("window",))

CONFIGS = {  # model_type: {name: kwargs of make_hf_model}
    "qwen3": {
        "untied-gqa2": dict(heads=4, kv_heads=2, head_dim=16, tied=False),
        "tied-mha": dict(heads=4, kv_heads=4, head_dim=16, tied=True),
        "gqa4-headdim-unequal": dict(hidden=48, heads=8, kv_heads=2, head_dim=24, tied=False),
        "three-layers-tied-gqa4": dict(layers=3, heads=4, kv_heads=1, head_dim=32, tied=True),
    },
    "qwen2": {  # head_dim is hidden / heads in transformers' Qwen2
        "untied-gqa2": dict(heads=4, kv_heads=2, head_dim=16, tied=False),
        "tied-mha": dict(heads=4, kv_heads=4, head_dim=16, tied=True),
        "three-layers-tied-gqa4": dict(layers=3, heads=4, kv_heads=1, head_dim=16, tied=True),
    },
}
SEQ_LENS = {"qwen3": [1, 7, 33, 100], "qwen2": [1, 33, 100]}  # 100: attention in 3 query blocks
MODEL_TYPES = list(CONFIGS)


def _load(tmp_path, model_type="qwen3", **kw):
    model = make_hf_model(model_type=model_type, **kw)
    model.save_pretrained(tmp_path)
    config, params = hf_io.load_pretrained(str(tmp_path))
    return model, config, params


def _assert_close(ours, ref, tol=1e-4):
    # Error relative to the logit scale, as in the issue: max |diff| / max |ref|.
    err = np.max(np.abs(ours - ref)) / max(1.0, np.max(np.abs(ref)))
    assert err <= tol, f"max relative logit error {err:.3g} > {tol}"


@pytest.mark.parametrize("model_type,name,seq_len", [(m, name, n) for m in MODEL_TYPES
                                                      for n in SEQ_LENS[m] for name in CONFIGS[m]])
def test_logits_match_transformers(tmp_path, model_type, name, seq_len):
    model, config, params = _load(tmp_path, model_type, **CONFIGS[model_type][name])
    assert config.model_type == model_type and config.tie_word_embeddings == CONFIGS[model_type][name]["tied"]
    if model_type == "qwen2":
        layer = params["layers"]
        assert {"q_bias", "k_bias", "v_bias"} <= set(layer) and not {"q_norm", "k_norm"} & set(layer)
        assert float(jnp.abs(layer["k_bias"]).max()) > 0.1  # the reference's biases are not zero
    tokens = np.random.RandomState(seq_len).randint(0, config.vocab_size, (2, seq_len))
    _assert_close(np.asarray(forward(params, config, jnp.asarray(tokens))), hf_logits(model, tokens))


@pytest.mark.parametrize("scan_layers", [False, True])
@pytest.mark.parametrize("remat", ["none", "full"])
def test_scan_and_remat_do_not_change_logits(tmp_path, scan_layers, remat):
    model, config, params = _load(tmp_path, layers=3)
    tokens = np.random.RandomState(0).randint(0, config.vocab_size, (2, 9))
    cfg = config.replace(scan_layers=scan_layers, remat_policy=remat)
    _assert_close(np.asarray(forward(params, cfg, jnp.asarray(tokens))), hf_logits(model, tokens))


KERNELS = {"portable": None, "cpu": cpu.KERNELS}  # cpu: the dense layers' custom VJP


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("model_type,name,seq_len", [("qwen3", "untied-gqa2", 100),
                                                      ("qwen3", "three-layers-tied-gqa4", 100),
                                                      ("qwen2", "untied-gqa2", 70)])
def test_gradients_match_transformers(tmp_path, model_type, name, seq_len, kernels):
    """Parameter gradients of a loss on the logits (autodiff's or the CPU backend's custom VJP
    of the dense layers, attention in 2-3 query blocks), Qwen2.5's biases included, equal
    PyTorch autograd's through transformers' model: its gradients are written as a checkpoint
    and read back with our loader, so the layouts match."""
    model, config, params = _load(tmp_path / "model", model_type, **CONFIGS[model_type][name])
    config = config.replace(kernels=KERNELS[kernels])
    rng = np.random.RandomState(0)
    tokens = rng.randint(0, config.vocab_size, (2, seq_len))
    weights = rng.randn(2, seq_len, config.vocab_size).astype(np.float32)
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


@pytest.mark.parametrize("kernels", KERNELS)
def test_remat_policies_do_not_change_gradients(kernels):
    """Rematerialisation (around the dense layers, autodiff's or the CPU's custom VJP, and the
    blocked attention) gives the gradients of no remat, to rounding (recomputed parts may fuse
    differently)."""
    from jaxscaffold.models.config import Qwen3Config
    cfg = Qwen3Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8, kernels=KERNELS[kernels])
    params = qwen3.init_params(cfg, jax.random.key(0))
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, 128, (2, 70)))  # 2 query blocks
    grads = {policy: jax.jit(jax.grad(lambda p, c=cfg.replace(remat_policy=policy):
                                      jnp.sum(qwen3.forward(p, c, tokens) ** 2)))(params)
             for policy in ("none", "full", "save_dots")}
    for policy in ("full", "save_dots"):
        for a, b in zip(jax.tree.leaves(grads["none"]), jax.tree.leaves(grads[policy])):
            scale = float(np.max(np.abs(np.asarray(a))))
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=1e-5 * max(1.0, scale))


def _padded_batch(lengths, total, vocab, left: bool, seed=0):
    rng = np.random.RandomState(seed)
    tokens = np.zeros((len(lengths), total), np.int32)
    mask = np.zeros((len(lengths), total), np.int32)
    for b, n in enumerate(lengths):
        sl = slice(total - n, total) if left else slice(0, n)
        tokens[b, sl] = rng.randint(0, vocab, n)
        mask[b, sl] = 1
    return tokens, mask


@pytest.mark.parametrize("left", [False, True], ids=["right-padded", "left-padded"])
def test_padded_batch_matches_unpadded_reference(tmp_path, left):
    model, config, params = _load(tmp_path, heads=4, kv_heads=2)
    lengths, total = [11, 4, 1, 8], 11
    tokens, mask = _padded_batch(lengths, total, config.vocab_size, left)
    ours = np.asarray(forward(params, config, jnp.asarray(tokens), segment_ids_BT=jnp.asarray(mask)))
    for b, n in enumerate(lengths):
        sl = slice(total - n, total) if left else slice(0, n)
        ref = hf_logits(model, tokens[b:b + 1, sl])[0]  # each row alone, no padding at all
        _assert_close(ours[b, sl], ref)
    # transformers on the padded batch itself agrees too (right padding: default positions).
    if not left:
        ref = hf_logits(model, tokens, attention_mask=mask)
        _assert_close(ours[mask == 1], ref[mask == 1])


def test_packed_segments_equal_separate_sequences(tmp_path):
    model, config, params = _load(tmp_path, heads=4, kv_heads=2)
    rng = np.random.RandomState(3)
    pieces = [rng.randint(0, config.vocab_size, n) for n in (5, 3, 6)]
    tokens = np.concatenate(pieces + [np.zeros(2, np.int64)])[None]
    segments = np.concatenate([np.full(len(p), i + 1) for i, p in enumerate(pieces)] + [np.zeros(2)])[None]
    ours = np.asarray(forward(params, config, jnp.asarray(tokens), segment_ids_BT=jnp.asarray(segments, jnp.int32)))
    start = 0
    for p in pieces:
        _assert_close(ours[0, start:start + len(p)], hf_logits(model, p[None])[0])
        start += len(p)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_bf16_compute_is_close_in_kl(tmp_path, capsys, model_type):
    """bf16 compute on f32 master weights (Qwen2.5's biases added in bf16) vs the f32
    reference: mean KL(ref || ours)."""
    model, config, params = _load(tmp_path, model_type, std=0.1)
    tokens = np.random.RandomState(0).randint(0, config.vocab_size, (4, 32))
    ref = hf_logits(model, tokens)
    ours = np.asarray(forward(params, config.replace(compute_dtype="bfloat16"), jnp.asarray(tokens)))
    logp_ref = jax.nn.log_softmax(ref, -1)
    logp = jax.nn.log_softmax(ours, -1)
    kl = float(jnp.mean(jnp.sum(jnp.exp(logp_ref) * (logp_ref - logp), -1)))
    with capsys.disabled():
        print(f"\n[parity] {model_type} bf16 compute vs f32 transformers: mean per-token KL {kl:.2e} nats")
    # The stated bound: mean per-token KL below 1e-3 nats.
    assert kl < 1e-3, kl


def test_xla_and_dot_product_attention_api_agree(tmp_path):
    """The cuDNN path goes through jax.nn.dot_product_attention; its XLA fallback must agree
    with ours so the GPU path computes the same function (cuDNN itself needs a GPU)."""
    from jaxscaffold.models import attention
    rng = np.random.RandomState(0)
    q = jnp.asarray(rng.randn(2, 9, 8, 16), jnp.float32)
    k = jnp.asarray(rng.randn(2, 9, 2, 16), jnp.float32)
    v = jnp.asarray(rng.randn(2, 9, 2, 16), jnp.float32)
    seg = jnp.asarray(np.array([[1] * 9, [0, 0, 1, 1, 1, 2, 2, 2, 2]]), jnp.int32)
    idx = jnp.broadcast_to(jnp.arange(9), (2, 9))
    mask = attention.attention_mask(seg, seg, idx, jnp.arange(9))
    ours = attention.xla_attention(q, k, v, mask)
    api = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], implementation="xla")
    real = np.asarray(seg) != 0
    np.testing.assert_allclose(np.asarray(ours)[real], np.asarray(api)[real], atol=1e-5)


@pytest.mark.parametrize("t", [31, 64, 100, 256])
def test_causal_blocks_equal_full_attention_values_and_gradients(t):
    """Self-attention in query blocks (`causal_attention`: 1, 2, 3 and 8 blocks here) computes
    the reference attention and its gradients on every non-padding token, with padding and
    packed segments."""
    from jaxscaffold.models import attention
    rng = np.random.RandomState(t)
    q, r = (jnp.asarray(rng.randn(2, t, 8, 16), jnp.float32) for _ in range(2))
    k, v = (jnp.asarray(rng.randn(2, t, 2, 16), jnp.float32) for _ in range(2))
    seg = np.ones((2, t), np.int32)
    seg[1, : t // 5] = 0  # left padding, then two packed sequences
    seg[1, t // 2:] = 2
    seg = jnp.asarray(seg)
    mask = attention.attention_mask(seg, seg, jnp.broadcast_to(jnp.arange(t), (2, t)), jnp.arange(t))
    real = (seg != 0)[:, :, None, None]

    def loss(fn, q, k, v):
        out = fn(q, k, v, mask)
        return jnp.sum(jnp.where(real, out * r, 0.0)), out

    grads = [jax.grad(functools.partial(loss, fn), argnums=(0, 1, 2), has_aux=True)(q, k, v)
             for fn in (attention.causal_attention, attention.xla_attention)]
    (g_blocks, out_blocks), (g_ref, out_ref) = grads
    np.testing.assert_allclose(np.asarray(out_blocks)[np.asarray(seg) != 0],
                               np.asarray(out_ref)[np.asarray(seg) != 0], atol=1e-5)
    for a, b in zip(g_blocks, g_ref):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4)


def test_splash_attention_interpret_mode_matches_xla():
    """The TPU splash kernel, run in Pallas interpret mode on CPU, computes our attention."""
    from jaxscaffold.models import attention
    rng = np.random.RandomState(1)
    t = 20
    q = jnp.asarray(rng.randn(1, t, 4, 16), jnp.float32)
    k = jnp.asarray(rng.randn(1, t, 2, 16), jnp.float32)
    v = jnp.asarray(rng.randn(1, t, 2, 16), jnp.float32)
    seg = jnp.asarray([[0] * 3 + [1] * 10 + [2] * 7], jnp.int32)
    idx = jnp.arange(t)[None]
    ref = attention.xla_attention(q, k, v, attention.attention_mask(seg, seg, idx, jnp.arange(t)))
    out = attention.splash_attention(q, k, v, seg, interpret=True)
    real = np.asarray(seg)[0] != 0
    np.testing.assert_allclose(np.asarray(out)[0, real], np.asarray(ref)[0, real], atol=2e-5)


@pytest.mark.parametrize("scan_layers", [True, False], ids=["scan", "unrolled"])
def test_kv_cache_prefill_then_steps_equals_full_forward(tmp_path, scan_layers):
    """Right-padded prompts of mixed lengths, prefilled into a cache, then fed one token at a
    time: every step's logits equal the full forward of the whole sequence, with the stacked
    weights scanned or unrolled (the backends' own layouts: tests/backends)."""
    model, config, params = _load(tmp_path, heads=4, kv_heads=2)
    config = config.replace(scan_layers=scan_layers)
    check_prefill_then_steps(model, config, jax.jit(qwen3.forward, static_argnums=1), params,
                             qwen3.KVCache.empty(config, 3, 16, dtype="float32"))


def check_prefill_then_steps(model, config, step, params, cache):
    """`step(params, config, tokens, segment_ids_BT=, cache=)` over an empty 3-row `cache`:
    prefill then 4 single-token steps, each step's logits against transformers'."""
    rng = np.random.RandomState(5)
    lengths, total, steps = [6, 2, 4], 6, 4
    full = rng.randint(0, config.vocab_size, (3, total + steps)).astype(np.int32)
    prompt, mask = np.zeros((3, total), np.int32), np.zeros((3, total), np.int32)
    for b, n in enumerate(lengths):
        prompt[b, :n], mask[b, :n] = full[b, :n], 1
    logits, cache = step(params, config, jnp.asarray(prompt), segment_ids_BT=jnp.asarray(mask), cache=cache)
    np.testing.assert_array_equal(np.asarray(cache.lengths), lengths)
    for b, n in enumerate(lengths):
        _assert_close(np.asarray(logits)[b, :n], hf_logits(model, full[b:b + 1, :n])[0])
    for s in range(steps):
        nxt = np.stack([full[b, n + s] for b, n in enumerate(lengths)])[:, None]
        logits, cache = step(params, config, jnp.asarray(nxt), cache=cache)
        for b, n in enumerate(lengths):
            ref = hf_logits(model, full[b:b + 1, :n + s + 1])[0, -1]
            _assert_close(np.asarray(logits)[b, 0], ref)


def test_bf16_cache_holds_the_rounded_keys_and_values(tmp_path):
    """The model's bf16 cache is stored as bf16 (the CPU backend's, as bits: tests/backends):
    layer 0's cached keys/values (computed before any attention) are exactly the f32 cache's
    rounded to bf16, at the written slots, and the empty slots stay zero."""
    _, config, params = _load(tmp_path, heads=4, kv_heads=2)
    check_bf16_cache(config, params, jax.jit(qwen3.forward, static_argnums=1),
                     lambda dtype: qwen3.KVCache.empty(config, 2, 8, dtype=dtype), lambda buf: buf, jnp.bfloat16)


def check_bf16_cache(config, params, step, empty, values, stored_dtype):
    """A 2-row bf16 cache (`empty(dtype)`, read back with `values`) holds the f32 one's rounded."""
    tokens = jnp.asarray(np.random.RandomState(1).randint(0, config.vocab_size, (2, 5)), jnp.int32)
    seg = jnp.asarray([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], jnp.int32)
    caches = {dtype: step(params, config, tokens, segment_ids_BT=seg, cache=empty(dtype))[1]
              for dtype in ("float32", "bfloat16")}
    for name in ("k", "v"):
        ref = np.asarray(getattr(caches["float32"], name)[0])  # layer 0: [B, G, S, K]
        stored = getattr(caches["bfloat16"], name)[0]
        assert stored.dtype == stored_dtype
        got = np.asarray(values(stored))
        assert got.dtype == jnp.bfloat16
        np.testing.assert_array_equal(got.astype(np.float32), ref.astype(jnp.bfloat16).astype(np.float32))
        assert np.all(got[0, :, 5:] == 0) and np.all(got[1, :, 2:] == 0) and np.any(got[1, :, :2] != 0)


# ------------------------------------------------------------- Qwen2.5 ("qwen2") only


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


def test_cpu_decode_layout_prefill_then_steps_equal_transformers(tmp_path):
    """The biases survive the CPU decode layout (fused qkv in 2 column blocks, per-layer cache):
    prefill then single-token steps give transformers' logits; so does the stacked cache."""
    model, config, params = _load(tmp_path, "qwen2", heads=4, kv_heads=2)
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
