import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxscaffold import compiler


def _matvec(w_FD, x_PD):
    return jnp.einsum("fd,pd->fp", w_FD, x_PD, preferred_element_type=jnp.float32)


CPUINFO = {  # trimmed /proc/cpuinfo of the kinds of machine this runs on
    "zen3": "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma f16c bmi2\n",
    "zen4": "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512bw avx512_bf16 avx512_vnni\n",
    "sapphire_rapids": "processor\t: 0\nflags\t\t: avx2 avx512f amx_bf16 amx_tile amx_int8\n",
    "neoverse_v1": "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n",
}


@pytest.mark.parametrize("cpu,has", [("zen3", False), ("zen4", True), ("sapphire_rapids", True),
                                     ("neoverse_v1", True), ("missing", False)])
def test_bf16_dot_instructions_are_read_from_cpuinfo(tmp_path, cpu, has):
    path = tmp_path / "cpuinfo"
    if cpu != "missing":
        path.write_text(CPUINFO[cpu])
    assert compiler.cpu_has_bf16_dots(str(path)) is has


def test_options_are_for_cpus_without_bf16_dots(monkeypatch):
    monkeypatch.setattr(compiler, "cpu_has_bf16_dots", lambda: False)
    assert compiler.compiler_options("cpu") == {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"}
    assert compiler.compiler_options("tpu") is None and compiler.compiler_options("gpu") is None
    monkeypatch.setattr(compiler, "cpu_has_bf16_dots", lambda: True)
    assert compiler.compiler_options("cpu") is None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_jit_compiles_dots_with_the_cpu_options_and_keeps_their_values(dtype):
    rng = np.random.RandomState(0)
    w = jnp.asarray(rng.randn(512, 96), dtype)
    x = jnp.asarray(rng.randn(8, 96), dtype)
    ours = compiler.jit(_matvec)
    program = ours.lower(w, x).compile().as_text()
    with_options = jax.jit(_matvec, compiler_options=compiler.compiler_options("cpu"))
    assert program == with_options.lower(w, x).compile().as_text()
    if dtype == "bfloat16" and not compiler.cpu_has_bf16_dots():
        # What the option changes: YNNPACK's dot takes the weights widened to f32 inside the
        # fusion (its fast f32 kernel) instead of its bf16 x bf16 kernel (slow without AVX-512).
        assert program != jax.jit(_matvec).lower(w, x).compile().as_text()
    # Independent reference: the same (rounded) inputs, multiplied in float64 by NumPy.
    want = np.asarray(w, np.float64) @ np.asarray(x, np.float64).T
    np.testing.assert_allclose(np.asarray(ours(w, x)), want, rtol=1e-5, atol=1e-5)


def test_jit_passes_static_and_donated_arguments_through():
    @functools.partial(compiler.jit, static_argnames=("scale",), donate_argnames=("x",))
    def scaled(x, *, scale):
        return x * scale

    x = jnp.arange(4.0)
    np.testing.assert_array_equal(np.asarray(scaled(x, scale=3)), [0.0, 3.0, 6.0, 9.0])
    assert x.is_deleted()  # donated
    assert scaled.__name__ == "scaled"  # compile-count tests look programs up by name
