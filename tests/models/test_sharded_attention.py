"""Fused attention on a mesh (8 fake CPU devices): the Pallas splash kernel, run in interpret
mode under shard_map, equals the XLA reference in values and gradients, alone and inside a
sharded train step; the kernel's layout follows the sharding rules."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxscaffold.models import attention, qwen3, sharded_attention
from jaxscaffold.models.config import Qwen3Config
from jaxscaffold.models.sharding import MeshConfig, ShardingRules, make_mesh, shard_batch
from jaxscaffold.rl.presets import preset
from jaxscaffold.rl.train_step import init_train_state, make_train_step, state_shardings


def _max_rel(a, b) -> float:
    """Largest difference relative to the reference's largest entry."""
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))


def test_kernel_layout_follows_the_rules():
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    # Rows over data x fsdp, heads over tensor, the sequence whole.
    assert sharded_attention.kernel_specs(mesh, batch=8, kv_heads=2) == (
        P(("data", "fsdp"), None, ("tensor",), None), P(("data", "fsdp"), None))
    # An axis that does not divide is left out (its devices repeat the work): 2 rows, 1 kv head.
    assert sharded_attention.kernel_specs(mesh, batch=2, kv_heads=1) == (P(("data",), None, None, None),
                                                                        P(("data",), None))
    # Other rules, other layout; size-1 axes are not named.
    rules = ShardingRules(batch="fsdp", q_heads=None)
    mesh = make_mesh(MeshConfig(data=1, fsdp=8, tensor=1))
    assert sharded_attention.kernel_specs(mesh, 16, 4, rules) == (P(("fsdp",), None, None, None), P(("fsdp",), None))


@pytest.mark.slow
def test_splash_under_shard_map_equals_the_reference():
    """A 4 x 2 (data x tensor) mesh, 256 tokens, GQA (4 query heads on 2 kv heads), right and
    left padding and packed segments: values and gradients within 1e-5 of the largest entry
    (measured ~2e-7 and ~6e-7)."""
    mesh = make_mesh(MeshConfig(data=4, fsdp=1, tensor=2))
    rng = np.random.RandomState(0)
    b, t, h, g, d = 4, 256, 4, 2, 16
    q, w = (jnp.asarray(rng.randn(b, t, h, d), jnp.float32) for _ in range(2))
    k, v = (jnp.asarray(rng.randn(b, t, g, d), jnp.float32) for _ in range(2))
    seg = np.ones((b, t), np.int32)
    seg[0, 200:] = 0  # right padding
    seg[1, 100:] = 2  # two packed segments
    seg[2, :30] = 0  # left padding
    seg[3, 128:] = 3  # a segment starting on a kernel block
    seg = jnp.asarray(seg)
    real = (seg != 0)[:, :, None, None]  # padding queries' outputs are not read
    idx = jnp.arange(t)
    mask = attention.attention_mask(seg, seg, jnp.broadcast_to(idx, (b, t)), idx)
    kernel = functools.partial(attention.splash_attention, interpret=True)

    def ours(q, k, v):
        with sharded_attention.kernel_mesh(mesh):
            return sharded_attention.on_mesh(kernel, q, k, v, seg)

    def reference(q, k, v):
        return attention.xla_attention(q, k, v, mask)

    def loss(f):
        return lambda q, k, v: jnp.sum(jnp.where(real, f(q, k, v) * w, 0.0))

    qkv_sharding = NamedSharding(mesh, P(("data", "fsdp"), None, "tensor"))
    sharded = [jax.device_put(x, qkv_sharding) for x in (q, k, v)]
    assert "manual_computation" in jax.jit(ours).lower(*sharded).as_text()  # the kernel runs per device
    out = jax.jit(ours)(*sharded)
    assert _max_rel(jnp.where(real, out, 0.0), jnp.where(real, reference(q, k, v), 0.0)) < 1e-5
    grads = jax.jit(jax.grad(loss(ours), argnums=(0, 1, 2)))(*sharded)
    grads_ref = jax.grad(loss(reference), argnums=(0, 1, 2))(q, k, v)
    for ours_g, ref_g in zip(grads, grads_ref):
        assert _max_rel(ours_g, ref_g) < 1e-5


@pytest.mark.slow
def test_sharded_train_step_runs_splash_per_device(monkeypatch):
    """The train step on a data x tensor mesh with `attention_impl="splash"` (interpret mode)
    makes the update of the XLA kernel: the step enters its mesh, the model's dispatch wraps
    the kernel in shard_map."""
    config = Qwen3Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=16, tie_word_embeddings=False)
    mesh = make_mesh(MeshConfig(data=4, fsdp=1, tensor=2))
    rng = np.random.RandomState(3)
    b, t = 8, 24
    lengths = rng.randint(6, t + 1, b)
    seg = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
    mask = seg.copy()
    mask[:, :3] = 0
    batch = {"tokens_BT": rng.randint(0, 96, (b, t)).astype(np.int32), "segment_ids_BT": seg, "loss_mask_BT": mask,
             "old_logp_BT": np.zeros((b, t), np.float32) - 4.0, "adv_B": rng.randn(b).astype(np.float32)}
    params = qwen3.init_params(config, jax.random.key(0))
    sgd = optax.sgd(1.0)

    def update(impl):
        c = config.replace(attention_impl=impl)
        step = make_train_step(c, preset("grpo"), sgd, mesh=mesh)
        state = jax.device_put(init_train_state(jax.tree.map(jnp.copy, params), sgd), state_shardings(c, sgd, mesh))
        manual = "manual_computation" in step.lower(state, shard_batch(batch, mesh)).as_text()
        new, metrics = step(state, shard_batch(batch, mesh))
        delta = jax.tree.map(lambda a, p: np.asarray(a) - np.asarray(p), new.params, params)
        return delta, float(metrics["loss"]), manual

    monkeypatch.setattr(attention, "SPLASH_INTERPRET", True)  # the TPU kernel, interpreted on CPU
    u_splash, loss_splash, manual = update("splash")
    assert manual  # the kernel ran per device, under shard_map
    u_xla, loss_xla, manual = update("xla")
    assert not manual
    np.testing.assert_allclose(loss_splash, loss_xla, rtol=1e-5)
    for path, a in jax.tree_util.tree_leaves_with_path(u_splash):
        b_ = u_xla
        for key in path:
            b_ = b_[key.key]
        assert _max_rel(a, b_) < 1e-4, path
