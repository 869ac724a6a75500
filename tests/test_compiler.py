"""`compiler.jit`: the platform backend's XLA options (which ones: tests/backends/test_cpu.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxscaffold import compiler
from jaxscaffold.backends import cpu


def _matvec(w_FD, x_PD):
    return jnp.einsum("fd,pd->fp", w_FD, x_PD, preferred_element_type=jnp.float32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_jit_compiles_dots_with_the_cpu_options_and_keeps_their_values(dtype):
    rng = np.random.RandomState(0)
    w = jnp.asarray(rng.randn(512, 96), dtype)
    x = jnp.asarray(rng.randn(8, 96), dtype)
    ours = compiler.jit(_matvec)
    program = ours.lower(w, x).compile().as_text()
    with_options = jax.jit(_matvec, compiler_options=compiler.compiler_options("cpu"))
    assert program == with_options.lower(w, x).compile().as_text()
    if dtype == "bfloat16" and not cpu.cpu_has_bf16_dots():
        # What the option changes: YNNPACK's dot takes the weights widened to f32 inside the
        # fusion (its fast f32 kernel) instead of its bf16 x bf16 kernel (slow without AVX-512).
        assert program != jax.jit(_matvec).lower(w, x).compile().as_text()
    if cpu.cpu_has_bf16_dots():  # a dot compiles as by default: YNNPACK's own kernel
        assert program == jax.jit(_matvec).lower(w, x).compile().as_text()
    # Independent reference: the same (rounded) inputs, multiplied in float64 by NumPy.
    want = np.asarray(w, np.float64) @ np.asarray(x, np.float64).T
    np.testing.assert_allclose(np.asarray(ours(w, x)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.default_emitters
def test_jit_softmax_rounds_a_row_alike_at_any_batch_size():
    """A row's softmax over 256 entries (a decode step's attention) is bitwise the same in a
    batch of 1 to 16 rows. XLA:CPU's default hands reductions of about 4096 elements and more
    to YNNPACK, which sums a row in another order than XLA's own emitters below that size."""
    x = jnp.asarray(np.random.RandomState(0).randn(16, 4, 256), jnp.float32)
    softmax = compiler.jit(lambda x: jax.nn.softmax(x, axis=-1))
    want = np.asarray(softmax(x[:1]))
    for n in (2, 4, 8, 16):
        np.testing.assert_array_equal(np.asarray(softmax(x[:n]))[:1], want, err_msg=f"batch {n}")


def test_jit_passes_static_and_donated_arguments_through():
    @functools.partial(compiler.jit, static_argnames=("scale",), donate_argnames=("x",))
    def scaled(x, *, scale):
        return x * scale

    x = jnp.arange(4.0)
    np.testing.assert_array_equal(np.asarray(scaled(x, scale=3)), [0.0, 3.0, 6.0, 9.0])
    assert x.is_deleted()  # donated
    assert scaled.__name__ == "scaled"  # compile-count tests look programs up by name
