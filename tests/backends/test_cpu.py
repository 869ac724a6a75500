"""The CPU backend: its decode layout and per-layer cache compute the model, its kernels the
model's values, its compiler options where they were measured to help."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxscaffold import compiler
from jaxscaffold.backends import cpu
from jaxscaffold.models import hf_io, qwen3
from tests.models.hf_reference import make_hf_model
from tests.models.test_parity import check_bf16_cache, check_prefill_then_steps

forward = jax.jit(qwen3.forward, static_argnums=1)
cpu_forward = jax.jit(cpu.forward, static_argnums=1, static_argnames=("window",))


def _load(tmp_path, **kw):
    model = make_hf_model(**kw)
    model.save_pretrained(tmp_path)
    config, params = hf_io.load_pretrained(str(tmp_path))
    return model, config, params


def test_kv_cache_prefill_then_steps_equals_full_forward(tmp_path):
    """Decode-layout weights in 2 blocks with per-layer cache buffers: prefill, then one token
    at a time, every step's logits equal transformers' full forward."""
    model, config, params = _load(tmp_path, heads=4, kv_heads=2)
    fast = cpu.decode_layout(params, config, blocks=2)
    assert len(fast["layers"][0]["gate_up"]) == 2 and len(fast["lm_head"]) == 2
    check_prefill_then_steps(model, config, cpu_forward, fast, cpu.empty_cache(config, 3, 16, dtype="float32"))


def test_decode_layout_forward_equals_stacked(tmp_path):
    """Without a cache too, `decode_layout` weights (tied and untied heads) give the stacked
    weights' logits."""
    for tie in (True, False):
        _, config, params = _load(tmp_path / str(tie), tied=tie)
        tokens = jnp.asarray(np.random.RandomState(0).randint(0, config.vocab_size, (2, 7)), jnp.int32)
        ref = qwen3.forward(params, config, tokens)
        for blocks in (1, 2, 4):
            out = cpu.forward(cpu.decode_layout(params, config, blocks), config, tokens)
            np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5)


def test_decode_layout_rows_do_not_depend_on_the_batch_size(tmp_path):
    """A decode step's few rows go through fixed row panels, so a row's logits are bitwise the
    same whichever batch (2 to 32 rows, any neighbours) it is computed in, and equal the
    stacked weights' logits (a lone row takes the matrix-vector kernel: close, not bitwise)."""
    _, config, params = _load(tmp_path, heads=4, kv_heads=2)
    fast = cpu.decode_layout(params, config, blocks=2)
    tokens = jnp.asarray(np.random.RandomState(2).randint(0, config.vocab_size, (32, 1)), jnp.int32)
    whole = np.asarray(cpu_forward(fast, config, tokens))
    np.testing.assert_allclose(whole, np.asarray(forward(params, config, tokens)), atol=1e-5)
    for rows in (2, 3, 8, 9, 17):
        part = np.asarray(cpu_forward(fast, config, tokens[-rows:]))
        np.testing.assert_array_equal(part, whole[-rows:], err_msg=f"{rows} rows")
    np.testing.assert_allclose(np.asarray(cpu_forward(fast, config, tokens[-1:])), whole[-1:], atol=1e-5)


def test_bf16_cache_holds_the_rounded_keys_and_values_as_bits(tmp_path):
    """The per-layer bf16 cache is stored as raw bits (XLA:CPU has no bf16 scatter): layer 0's
    keys/values are exactly the f32 cache's rounded to bf16, the empty slots zero."""
    _, config, params = _load(tmp_path, heads=4, kv_heads=2)
    check_bf16_cache(config, cpu.decode_layout(params, config), cpu_forward,
                     lambda dtype: cpu.empty_cache(config, 2, 8, dtype=dtype), cpu.kv_values, jnp.uint16)


def test_bf16_embedding_rows_are_gathered_exactly():
    """16-bit tables are gathered as raw bits: the rows equal NumPy indexing bit for bit."""
    table = jax.random.normal(jax.random.key(0), (50, 8)).astype(jnp.bfloat16)
    tokens = jnp.asarray([[3, 0, 49], [7, 7, 1]], jnp.int32)
    rows = cpu.embed_rows(table, tokens)
    assert rows.dtype == jnp.bfloat16
    want = np.asarray(table).view(np.uint16)[np.asarray(tokens)]
    np.testing.assert_array_equal(np.asarray(rows).view(np.uint16), want)


def test_kernels_give_the_portable_forward_values():
    """The CPU kernels change how gradients are computed, not a forward value: logits are
    bitwise those of the portable kernels (f32 and bf16 weights)."""
    for dtype in ("float32", "bfloat16"):
        config = qwen3.Qwen3Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2,
                                   num_heads=4, num_kv_heads=2, head_dim=8, param_dtype=dtype, compute_dtype=dtype)
        params = qwen3.init_params(config, jax.random.key(0))
        tokens = jnp.asarray(np.random.RandomState(0).randint(0, 96, (2, 9)), jnp.int32)
        ours = forward(params, cpu.CPU().with_kernels(config), tokens)
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(forward(params, config, tokens)))


# ----------------------------------------------------------------------------- compiler options

CPUINFO = {  # trimmed /proc/cpuinfo of the kinds of machine this runs on
    "zen3": "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma f16c bmi2\n",
    "zen4": "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512bw avx512_bf16 avx512_vnni\n",
    "sapphire_rapids": "processor\t: 0\nflags\t\t: avx2 avx512f amx_bf16 amx_tile amx_int8\n",
    "neoverse_v1": "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n",
}


@pytest.mark.parametrize("cpu_kind,has", [("zen3", False), ("zen4", True), ("sapphire_rapids", True),
                                          ("neoverse_v1", True), ("missing", False)])
def test_bf16_dot_instructions_are_read_from_cpuinfo(tmp_path, cpu_kind, has):
    path = tmp_path / "cpuinfo"
    if cpu_kind != "missing":
        path.write_text(CPUINFO[cpu_kind])
    assert cpu.cpu_has_bf16_dots(str(path)) is has


def test_cpu_options_by_bf16_dot_support(monkeypatch):
    monkeypatch.setattr(cpu, "cpu_has_bf16_dots", lambda: False)
    assert compiler.compiler_options("cpu") == {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"}
    assert compiler.compiler_options("tpu") is None and compiler.compiler_options("gpu") is None
    monkeypatch.setattr(cpu, "cpu_has_bf16_dots", lambda: True)  # their own dots; reductions in XLA
    assert compiler.compiler_options("cpu") == {
        "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}
    assert compiler.compiler_options("tpu") is None and compiler.compiler_options("gpu") is None
