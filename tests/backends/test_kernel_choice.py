"""The plan and the FLOP count follow the backend's kernel choice for the target: splash on
any TPU mesh, cuDNN on GPU in bf16, else the flash loop; the kernels' matmul counts are
read off their own programs."""

import functools
import os
import sys

import jax
import jax.numpy as jnp
import pytest

from jaxscaffold import config as config_lib
from jaxscaffold.models import attention, flash_attention
from jaxscaffold.models import config as model_configs
from jaxscaffold.train import memory_plan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "launch"))

from benchmarks import train_flops  # noqa: E402


def tiny(*overrides):
    cd = config_lib.load_file(os.path.join(ROOT, "configs", "tiny.py"))
    return config_lib.from_configdict(config_lib.parse_overrides(cd, list(overrides)))


@pytest.mark.parametrize("platform, dtype, kernel", [
    ("tpu", "float32", "splash"), ("gpu", "bfloat16", "cudnn"), ("gpu", "float32", "flash"),
    ("portable", "bfloat16", "flash")])
def test_the_plan_names_the_targets_kernel_on_a_mesh(platform, dtype, kernel):
    cfg = tiny("mesh.data=1", "mesh.fsdp=4", "mesh.tensor=2", f"model.compute_dtype={dtype}")
    p = memory_plan.plan(cfg, hbm_bytes=16e9, devices=jax.devices()[:8], compile_step=False, platform=platform)
    assert p.attention_kernel == kernel and p.to_dict()["attention_kernel"] == kernel
    assert any(kernel in n and "flash loop in its place" in n for n in p.notes) == (kernel != "flash")


def test_a_tpu_plan_compiles_the_flash_stand_in():
    """Splash does not compile on CPU devices: the plan compiles the flash loop, O(T) like it,
    so its activations are the portable plan's."""
    cfg = tiny("mesh.devices=1")
    tpu = memory_plan.plan(cfg, hbm_bytes=16e9, devices=jax.devices()[:1], platform="tpu")
    portable = memory_plan.plan(cfg, hbm_bytes=16e9, devices=jax.devices()[:1])
    assert tpu.attention_kernel == "splash" and portable.attention_kernel == "flash"
    assert tpu.activations == portable.activations > 0


def _dots_in_kernels(jaxpr, inside: bool) -> int:
    """dot_general equations in `jaxpr`, counting only those inside a Pallas kernel or a
    custom_vjp rule when `inside` is False at the top (the kernel's own matmuls)."""
    n = 0
    for eqn in jaxpr.eqns:
        n += eqn.primitive.name == "dot_general" and inside
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    n += _dots_in_kernels(sub, inside or eqn.primitive.name in ("pallas_call", "custom_vjp_call"))
    return n


@pytest.mark.parametrize("kernel", ["splash", "flash"])
def test_kernel_matmuls_are_the_kernels_own(kernel):
    """Forward + backward matmuls per visited tile pair, as the FLOP count assumes: splash 9
    (its dq and dkv kernels recompute the scores), the flash loop 7."""
    b, t, h, g, d = 1, 256, 2, 1, 64
    seg = jnp.ones((b, t), jnp.int32)
    f = {"splash": attention.splash_attention,
         "flash": functools.partial(flash_attention.flash_attention, block=128)}[kernel]
    shapes = [jax.ShapeDtypeStruct((b, t, n, d), jnp.float32) for n in (h, g, g)]
    loss = lambda q, k, v: jnp.sum(f(q, k, v, seg))  # noqa: E731
    grad = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(*shapes).jaxpr
    forward = jax.make_jaxpr(loss)(*shapes).jaxpr
    assert _dots_in_kernels(grad, inside=kernel == "flash") == train_flops.KERNEL_MATMULS[kernel]
    assert _dots_in_kernels(forward, inside=kernel == "flash") == 2


def test_kernel_attention_flops():
    c = model_configs.tiny(num_heads=4, num_kv_heads=2, head_dim=32)
    rows, t = 2, 256
    # The XLA kernel, by hand (tests/test_bench_train_flops.py): 8 blocks of 32 queries reading
    # 32 j keys, 2 x 2 H K a pair, x 3 with the backward; remat: the forward once more.
    attn = 2 * 2 * c.num_heads * c.head_dim * c.num_layers * rows * sum(32 * 32 * j for j in range(1, 9))
    assert train_flops.kernel_attention_flops("xla", c, rows, t, "none") == pytest.approx(3 * attn)
    assert train_flops.kernel_attention_flops("xla", c, rows, t, "full") == pytest.approx(4 * attn)
    # Splash at 256 tokens: 3 of its 4 tiles of 128; cuDNN (a mask, no causal flag): all 4.
    one = 2.0 * c.num_layers * rows * c.num_heads * c.head_dim * t * t
    assert train_flops.kernel_attention_flops("splash", c, rows, t, "none") == pytest.approx(9 * 0.75 * one)
    assert train_flops.kernel_attention_flops("cudnn", c, rows, t, "save_dots") == pytest.approx(9 * one)
    assert train_flops.visited_fraction("flash", 16384) == pytest.approx(33 / 64)
    assert train_flops.run_kernels(c.replace(compute_dtype="bfloat16")) == {
        "tpu": "splash", "gpu": "cudnn", "portable": "flash"}
