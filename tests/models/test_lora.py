"""LoRA as a parameter transform: zero adapters are the base model exactly; merged adapters
equal PEFT's unmerged LoRA on the transformers model (the independent reference)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxscaffold.models import hf_io, lora as lora_lib, peft_io, qwen3
from jaxscaffold.models.config import tiny
from tests.models.hf_reference import hf_logits, make_hf_model

CONFIG = tiny(vocab_size=256)


def _random_adapters(config, lora, seed=0, scale=0.3):
    """Adapters with b != 0 (PEFT's init has b = 0): a real change of the model."""
    ad = lora_lib.init_adapters(config, lora, jax.random.key(seed))
    keys = iter(jax.random.split(jax.random.key(seed + 1), len(lora.targets)))
    return {t: {"a": v["a"], "b": scale * jax.random.normal(next(keys), v["b"].shape)} for t, v in ad.items()}


@pytest.mark.parametrize("param_dtype, compute_dtype", [("float32", "float32"), ("float32", "bfloat16"),
                                                        ("bfloat16", "bfloat16")])
def test_zero_initialised_adapters_give_the_base_logits_exactly(param_dtype, compute_dtype):
    config = CONFIG.replace(param_dtype=param_dtype, compute_dtype=compute_dtype)
    base = qwen3.init_params(config, jax.random.key(0))
    lora = lora_lib.LoraConfig(rank=4, alpha=8.0)
    adapters = lora_lib.init_adapters(config, lora, jax.random.key(1))
    assert all(np.abs(np.asarray(v["a"])).max() > 0 for v in adapters.values())  # a random, b zero
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, config.vocab_size, (2, 9)))
    fwd = jax.jit(qwen3.forward, static_argnums=1)
    ref = np.asarray(fwd(base, config, tokens))
    for merged in (lora_lib.merge(base, adapters, lora), lora_lib.merged(config, base, adapters, lora)):
        np.testing.assert_array_equal(np.asarray(fwd(merged, config, tokens)), ref)
    assert lora_lib.merged(config, base, adapters, lora)["layers"]["q"].dtype == jnp.promote_types(param_dtype, compute_dtype)


def test_merge_changes_only_the_targets_by_the_low_rank_product():
    base = qwen3.init_params(CONFIG, jax.random.key(0))
    lora = lora_lib.LoraConfig(rank=2, alpha=6.0, targets=("k", "up"))
    adapters = _random_adapters(CONFIG, lora)
    merged = lora_lib.merge(base, adapters, lora)
    for name, w in base["layers"].items():
        if name in lora.targets:
            a, b = (np.asarray(adapters[name][k], np.float64) for k in ("a", "b"))
            want = np.asarray(w, np.float64) + 3.0 * np.einsum("lir,lro->lio", a, b)
            np.testing.assert_allclose(np.asarray(merged["layers"][name]), want, atol=1e-6)
        else:
            assert merged["layers"][name] is w
    assert merged["embed"] is base["embed"]
    with pytest.raises(ValueError, match="targets"):
        lora_lib.LoraConfig(targets=("q", "lm_head"))


@pytest.mark.parametrize("targets", [lora_lib.TARGETS, ("q", "v")])
def test_peft_loads_the_adapters_onto_transformers_with_our_merged_logits(tmp_path, targets):
    """The PEFT directory we write, loaded by `peft.PeftModel.from_pretrained` onto the
    transformers base (which applies LoRA unmerged, x W^T + s (x A^T) B^T), gives the logits
    of our merged parameters."""
    from peft import PeftModel
    model = make_hf_model()
    model.save_pretrained(tmp_path / "base")
    config, base = hf_io.load_pretrained(str(tmp_path / "base"))
    lora = lora_lib.LoraConfig(rank=4, alpha=8.0, targets=targets)
    adapters = _random_adapters(config, lora, scale=0.5)
    peft_io.save_peft_adapter(str(tmp_path / "adapter"), config, lora, adapters,
                              base_model_name_or_path=str(tmp_path / "base"))
    peft_model = PeftModel.from_pretrained(model, str(tmp_path / "adapter")).eval()
    tokens = np.random.RandomState(0).randint(0, config.vocab_size, (2, 11))
    ref = hf_logits(peft_model, tokens)
    assert np.abs(ref - hf_logits(make_hf_model(), tokens)).max() > 1e-2  # the adapters matter
    ours = np.asarray(jax.jit(qwen3.forward, static_argnums=1)(lora_lib.merge(base, adapters, lora), config,
                                                               jnp.asarray(tokens)))
    # 1e-5 of the logit scale (the parity tests' measure): f32 rounding of merged vs unmerged
    # products only (measured 1.7e-6 of the scale, 1.0e-5 absolute at logits up to 6.3, every
    # target; 0.8e-6 for q, v).
    assert np.abs(ours - ref).max() / max(1.0, np.abs(ref).max()) < 1e-5
    # ... and PEFT's own merge into the base weights agrees with ours, matrix by matrix.
    merged_hf = peft_model.merge_and_unload().state_dict()
    w = lora_lib.merge(base, adapters, lora)["layers"]
    for t in targets:
        hf_w = merged_hf[f"model.layers.1.{peft_io.HF_MODULES[t]}.weight"].numpy()
        np.testing.assert_allclose(np.asarray(w[t][1]).T, hf_w, atol=1e-6, err_msg=t)
