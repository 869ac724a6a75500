"""The train step with LoRA: gradients reach the adapters only, and they are the chain rule of
the full model's gradient; micro-batch accumulation gives the one-batch update; sharded equals
single-device."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxscaffold.models import lora as lora_lib
from jaxscaffold.models import qwen3
from jaxscaffold.models.sharding import MeshConfig, make_mesh, shard_batch
from jaxscaffold.rl.presets import preset
from jaxscaffold.rl.train_step import init_train_state, make_train_step, state_shardings
from tests.rl.test_train_step import CONFIG, _batch, _params, _rel_diff

LORA = lora_lib.LoraConfig(rank=4, alpha=8.0, targets=("q", "v", "o", "gate", "down"))


def _adapters(seed=1, config=CONFIG, lora=LORA):
    """Random a and b (b not zero, so a's gradient is not zero either)."""
    ad = lora_lib.init_adapters(config, lora, jax.random.key(seed))
    keys = iter(jax.random.split(jax.random.key(seed + 100), len(lora.targets)))
    return {t: {"a": v["a"], "b": 0.3 * jax.random.normal(next(keys), v["b"].shape, v["b"].dtype)}
            for t, v in ad.items()}


def _lora_update(batch, base, adapters, n=1, algo="grpo", config=CONFIG, mesh=None):
    sgd = optax.sgd(1.0)  # the update is minus the gradient
    step = make_train_step(config, preset(algo), sgd, num_micro_batches=n, lora=LORA, mesh=mesh, logprob_chunk=4,
                           agg_constant=12.0)
    state = init_train_state(jax.tree.map(jnp.copy, adapters), sgd)
    if mesh is not None:
        state = jax.device_put(state, state_shardings(config, sgd, mesh, lora=LORA))
        batch = shard_batch(batch, mesh)
    new, metrics = step(state, batch, base)
    return new, jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), new.params, adapters), metrics


def test_gradients_reach_only_the_adapters_and_follow_the_chain_rule():
    base, adapters, batch = _params(), _adapters(), _batch(1)
    before = jax.tree.map(np.asarray, base)
    new, update, _ = _lora_update(batch, base, adapters)
    # The optimizer state and the trained tree are the adapters' (nothing of the base).
    assert jax.tree.structure(new.params) == jax.tree.structure(adapters)
    assert {x.shape for x in jax.tree.leaves(new.opt_state)} <= {x.shape for x in jax.tree.leaves(adapters)}
    for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(before)):
        np.testing.assert_array_equal(np.asarray(a), b)  # the base is untouched (and not donated)
    # Reference: the full model's gradient G at the merged weights (a full step with SGD(1)),
    # pulled back by hand: dL/da = s G b^T, dL/db = s a^T G.
    merged = lora_lib.merge(base, adapters, LORA)
    sgd = optax.sgd(1.0)
    full = make_train_step(CONFIG, preset("grpo"), sgd, logprob_chunk=4, agg_constant=12.0)
    state, _ = full(init_train_state(jax.tree.map(jnp.copy, merged), sgd), batch)
    for t in LORA.targets:
        g = -(np.asarray(state.params["layers"][t], np.float64) - np.asarray(merged["layers"][t], np.float64))
        a, b = (np.asarray(adapters[t][k], np.float64) for k in ("a", "b"))
        ref_a = -LORA.scale * np.einsum("lio,lro->lir", g, b)
        ref_b = -LORA.scale * np.einsum("lir,lio->lro", a, g)
        for ours, ref in ((update[t]["a"], ref_a), (update[t]["b"], ref_b)):
            assert np.abs(ref).max() > 0
            np.testing.assert_allclose(ours, ref, atol=2e-4 * np.abs(ref).max(), err_msg=t)


def test_zero_b_trains_b_first():
    """At PEFT's init (b = 0) the loss's gradient reaches b only: a's is exactly zero."""
    base, batch = _params(), _batch(2)
    adapters = lora_lib.init_adapters(CONFIG, LORA, jax.random.key(0))
    _, update, _ = _lora_update(batch, base, adapters)
    for t in LORA.targets:
        assert np.all(update[t]["a"] == 0) and np.abs(update[t]["b"]).max() > 0


def test_lora_accumulation_invariance():
    """1 micro-batch vs 4: the same adapter update (f64: exact to rounding; f32: the matmuls'
    batch-size-dependent rounding only)."""
    for algo in ("grpo", "dapo"):
        base, adapters, batch = qwen3.init_params(CONFIG, jax.random.key(0)), _adapters(), _batch(1)
        (_, u1, m1), (_, u4, m4) = (_lora_update(batch, base, adapters, n, algo) for n in (1, 4))
        assert _rel_diff(u1, u4) < 1e-5
        np.testing.assert_allclose(float(m1["loss"]), float(m4["loss"]), rtol=1e-5, atol=1e-6)
    with jax.enable_x64(True):
        config64 = CONFIG.replace(param_dtype="float64", compute_dtype="float64")
        base64 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), _params())
        ad64 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), _adapters())
        batch64 = {k: (v.astype(np.float64) if v.dtype == np.float32 else v) for k, v in _batch(1).items()}
        (_, u1, _), (_, u4, _) = (_lora_update(batch64, base64, ad64, n, config=config64) for n in (1, 4))
        assert u1["q"]["a"].dtype == np.float64 and _rel_diff(u1, u4) < 1e-10


def test_lora_sharded_step_equals_single_device():
    """fsdp x tensor on 8 fake devices: the same adapter update; adapters shard like their W."""
    mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))
    base, adapters, batch = _params(), _adapters(), _batch(2)
    _, u_ref, m_ref = _lora_update(batch, base, adapters, n=2)
    base_sh = jax.device_put(base, qwen3.param_shardings(CONFIG, mesh))
    s_sh, u_sh, m_sh = _lora_update(batch, base_sh, adapters, n=2, mesh=mesh)
    assert s_sh.params["gate"]["b"].sharding.spec == jax.sharding.PartitionSpec(None, None, "tensor")
    assert s_sh.params["gate"]["a"].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", None)
    assert _rel_diff(u_ref, u_sh) < 5e-4
    np.testing.assert_allclose(float(m_ref["loss"]), float(m_sh["loss"]), rtol=1e-5)


def test_kl_reference_is_the_base():
    """With LoRA the KL reference is the base itself: zero adapters give KL 0, others not."""
    opt = optax.sgd(0.0)
    step = make_train_step(CONFIG, preset("grpo", kl_coef=0.1), opt, with_reference=True, lora=LORA)
    base, batch = _params(), _batch(5)
    zero = lora_lib.init_adapters(CONFIG, LORA, jax.random.key(0))
    _, m_zero = step(init_train_state(zero, opt), batch, base)
    _, m_other = step(init_train_state(_adapters(), opt), batch, base)
    assert abs(float(m_zero["kl"])) < 1e-6 and float(m_other["kl"]) > 1e-4
