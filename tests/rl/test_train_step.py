"""The jitted train step: chunked logprobs, exact accumulation, sharding, the NaN guard; for
full fine-tuning and for LoRA (gradients reach the adapters only, as the chain rule of the
full model's gradient; accumulation and sharding as for full fine-tuning; the base is the KL
reference)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxscaffold.models import lora as lora_lib
from jaxscaffold.models import qwen3
from jaxscaffold.models.config import Qwen3Config
from jaxscaffold.models.sharding import MeshConfig, make_mesh, shard_batch
from jaxscaffold.rl import logprobs as lp_lib
from jaxscaffold.rl.losses import AGG_MODES
from jaxscaffold.rl.presets import preset
from jaxscaffold.rl.train_step import (OptimizerConfig, init_train_state, make_train_step, state_shardings)

CONFIG = Qwen3Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=8, tie_word_embeddings=False)


def _params(seed=0, config=CONFIG):
    p = qwen3.init_params(config, jax.random.key(seed))
    return jax.tree.map(lambda x: x * 10 if x.ndim > 1 else x, p)  # sharper distributions


def _batch(seed=0, b=8, t=12, config=CONFIG):
    rng = np.random.RandomState(seed)
    tokens = rng.randint(0, config.vocab_size, (b, t)).astype(np.int32)
    lengths = rng.randint(3, t + 1, b)
    seg = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
    mask = seg.copy()
    mask[:, :2] = 0  # the prompt
    logp, _ = lp_lib.token_logprobs(_params(), config, jnp.asarray(tokens), segment_ids_BT=jnp.asarray(seg))
    old = np.asarray(logp) + rng.randn(b, t).astype(np.float32) * 0.3  # off-policy: both clips bind
    return {"tokens_BT": tokens, "segment_ids_BT": seg, "loss_mask_BT": mask,
            "old_logp_BT": (old * mask).astype(np.float32), "adv_B": rng.randn(b).astype(np.float32)}


def test_chunked_logprobs_equal_full_log_softmax():
    params, batch = _params(), _batch()
    tokens, seg = jnp.asarray(batch["tokens_BT"]), jnp.asarray(batch["segment_ids_BT"])

    def naive(params):
        logits = qwen3.forward(params, CONFIG, tokens, segment_ids_BT=seg)
        logp = jax.nn.log_softmax(logits, -1)
        tgt = jnp.take_along_axis(logp[:, :-1], tokens[:, 1:, None], -1)[..., 0]
        ent = -jnp.sum(jnp.exp(logp) * logp, -1)[:, :-1]
        return jnp.pad(tgt, ((0, 0), (1, 0))), jnp.pad(ent, ((0, 0), (1, 0)))

    for chunk in (1, 5, 64):
        ours = lp_lib.token_logprobs(params, CONFIG, tokens, segment_ids_BT=seg, chunk=chunk)
        ref = naive(params)
        np.testing.assert_allclose(np.asarray(ours[0]), np.asarray(ref[0]), atol=1e-5)
        np.testing.assert_allclose(np.asarray(ours[1]), np.asarray(ref[1]), atol=1e-5)
    w = jnp.asarray(np.random.RandomState(0).randn(*tokens.shape), jnp.float32)
    g_ours = jax.grad(lambda p: jnp.sum(w * sum(lp_lib.token_logprobs(p, CONFIG, tokens, segment_ids_BT=seg, chunk=5))))(params)
    g_ref = jax.grad(lambda p: jnp.sum(w * sum(naive(p))))(params)
    for a, b in zip(jax.tree.leaves(g_ours), jax.tree.leaves(g_ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-4)


def test_masked_only_logprobs_equal_the_full_ones_where_the_loss_reads():
    params, batch = _params(), _batch()
    tokens, seg, mask = (jnp.asarray(batch[k]) for k in ("tokens_BT", "segment_ids_BT", "loss_mask_BT"))
    full = lp_lib.token_logprobs(params, CONFIG, tokens, segment_ids_BT=seg, chunk=5)
    k = int(mask.sum(1).max())
    for n in (k, k + 2, 100):  # exactly enough, more than enough (padding entries), more than T
        sparse = lp_lib.masked_token_logprobs(params, CONFIG, tokens, mask, n, segment_ids_BT=seg, chunk=4)
        for a, b in zip(sparse, full):
            np.testing.assert_allclose(np.asarray(a * mask), np.asarray(b * mask), atol=1e-5)
            assert float(jnp.abs(a * (1 - mask)).max()) == 0.0
    w = jnp.asarray(np.random.RandomState(1).randn(*tokens.shape), jnp.float32) * mask
    g_sparse = jax.grad(lambda p: jnp.sum(w * lp_lib.masked_token_logprobs(p, CONFIG, tokens, mask, k,
                                                                          segment_ids_BT=seg)[0]))(params)
    g_full = jax.grad(lambda p: jnp.sum(w * lp_lib.token_logprobs(p, CONFIG, tokens, segment_ids_BT=seg)[0]))(params)
    for a, b in zip(jax.tree.leaves(g_sparse), jax.tree.leaves(g_full)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4 * max(1.0, float(jnp.abs(b).max())))


def test_scoring_masked_positions_only_gives_the_same_step():
    sgd = optax.sgd(1.0)
    outs = []
    for masked_only in (True, False):
        step = make_train_step(CONFIG, preset("grpo"), sgd, score_masked_only=masked_only)
        state, m = step(init_train_state(jax.tree.map(jnp.copy, _params()), sgd), _batch(3))
        outs.append((state.params, m))
        assert len(step.programs) == 1
    (p1, m1), (p2, m2) = outs
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5 * max(1.0, float(np.abs(b).max())))
    for key in ("loss", "entropy", "clipfrac_upper"):
        np.testing.assert_allclose(float(m1[key]), float(m2[key]), rtol=1e-5, atol=1e-6)


def _accumulated_updates(cfg, config, batch, params, ns=(1, 4), more_params=()):
    """[(update, metrics) for n in ns] for `params`, then the updates for each of `more_params`
    (the same compiled steps)."""
    outs, more = [], [[] for _ in more_params]
    for n in ns:
        sgd = optax.sgd(1.0)  # the update is the gradient itself, the most sensitive check
        step = make_train_step(config, cfg, sgd, num_micro_batches=n, logprob_chunk=4)
        for p, out in [(params, outs)] + list(zip(more_params, more)):
            state, metrics = step(init_train_state(jax.tree.map(jnp.copy, p), sgd), batch)
            out.append((jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), state.params, p), metrics))
    return outs if not more_params else (outs, more)


def _rel_diff(u1, u4):
    """||u1 - u4|| / ||u1|| over all parameters."""
    num = sum(float(np.sum((a - b) ** 2)) for a, b in zip(jax.tree.leaves(u1), jax.tree.leaves(u4)))
    den = sum(float(np.sum(a ** 2)) for a in jax.tree.leaves(u1))
    return (num / den) ** 0.5


@pytest.mark.parametrize("algo,agg", [("grpo", "seq-mean-token-mean"), ("dapo", "token-mean"),
                                      ("gspo", "seq-mean-token-sum"), ("drgrpo", "seq-mean-token-sum-norm")])
def test_accumulation_invariance(algo, agg):
    """1 micro-batch vs 4: the same update. In f64 it is exact to rounding (measured ~5e-15),
    which proves the algebra (global denominators, carried sums; every loss x agg mode is
    checked at the loss level in test_losses). In f32 the residue is the
    model's matmul rounding, which depends on the batch size XLA sees (measured ~3e-5 of
    the update's norm on this deliberately sharp model; ~2.7e-7 at the init scale), not the
    accumulation."""
    cfg = preset(algo, agg=agg, agg_constant=12.0)
    plain = qwen3.init_params(CONFIG, jax.random.key(0))  # the model's own init scale, not sharpened
    [(u1, m1), (u4, m4)], [[(v1, _), (v4, _)]] = _accumulated_updates(cfg, CONFIG, _batch(1), _params(),
                                                                       more_params=[plain])
    assert _rel_diff(u1, u4) < 1e-4
    assert _rel_diff(v1, v4) < 1e-6  # at the init scale f32 meets 1e-6 (measured ~2.7e-7)
    for k in ("loss", "clipfrac_upper", "clipfrac_lower", "ratio_min", "ratio_max", "entropy"):
        np.testing.assert_allclose(float(m1[k]), float(m4[k]), rtol=1e-5, atol=1e-6, err_msg=k)
    assert float(m1["clipfrac_upper"]) > 0 and float(m1["clipfrac_lower"]) > 0
    with jax.enable_x64(True):
        config64 = CONFIG.replace(param_dtype="float64", compute_dtype="float64")
        params64 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), _params())
        batch64 = {k: (v.astype(np.float64) if v.dtype == np.float32 else v) for k, v in _batch(1).items()}
        (u1, _), (u4, _) = _accumulated_updates(cfg, config64, batch64, params64)
        assert u1["embed"].dtype == np.float64
        assert _rel_diff(u1, u4) < 1e-10


def _sgd_update(config, algo, batch, params, mesh=None):
    sgd = optax.sgd(1.0)
    step = make_train_step(config, algo, sgd, num_micro_batches=2, mesh=mesh)
    state = init_train_state(jax.tree.map(jnp.copy, params), sgd)
    if mesh is not None:
        state, batch = jax.device_put(state, state_shardings(config, sgd, mesh)), shard_batch(batch, mesh)
    new, metrics = step(state, batch)
    return new, jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), new.params, params), metrics


def test_sharded_step_equals_single_device():
    """fsdp x tensor on 8 fake devices: the same update (SGD, so the update is the gradient).
    Exact to rounding in f64; in f32 the sharded matmuls sum partial products in another
    order (measured ~1e-4 of the update's norm on this deliberately sharp model)."""
    algo = preset("dapo")
    mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))
    _, u_ref, m_ref = _sgd_update(CONFIG, algo, _batch(2), _params())
    s_sh, u_sh, m_sh = _sgd_update(CONFIG, algo, _batch(2), _params(), mesh)
    assert s_sh.params["layers"]["gate"].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    assert _rel_diff(u_ref, u_sh) < 5e-4
    np.testing.assert_allclose(float(m_ref["loss"]), float(m_sh["loss"]), rtol=1e-5)
    with jax.enable_x64(True):
        config64 = CONFIG.replace(param_dtype="float64", compute_dtype="float64")
        params64 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), _params())
        batch64 = {k: (v.astype(np.float64) if v.dtype == np.float32 else v) for k, v in _batch(2).items()}
        _, u_ref, _ = _sgd_update(config64, algo, batch64, params64)
        _, u_sh, _ = _sgd_update(config64, algo, batch64, params64, mesh)
        assert _rel_diff(u_ref, u_sh) < 1e-10
    # And AdamW with warmup runs sharded, its moments sharded like the parameters.
    opt = OptimizerConfig(lr=1e-2, warmup_steps=2).make()
    step = make_train_step(CONFIG, algo, opt, mesh=mesh)
    state = jax.device_put(init_train_state(_params(), opt), state_shardings(CONFIG, opt, mesh))
    state, _ = step(state, shard_batch(_batch(2), mesh))
    mu = state.opt_state[1][0].mu["layers"]["gate"]
    assert mu.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor") and int(state.step) == 1


def test_non_finite_step_is_skipped_and_counted():
    opt = OptimizerConfig(lr=1e-2).make()
    step = make_train_step(CONFIG, preset("grpo"), opt)
    batch = _batch(3)
    batch["adv_B"] = batch["adv_B"].copy()
    batch["adv_B"][0] = np.nan
    params = _params()
    state, metrics = step(init_train_state(jax.tree.map(jnp.copy, params), opt), batch)  # state is donated
    assert int(state.skipped) == 1 and int(state.step) == 0 and float(metrics["skipped"]) == 1.0
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    ok = _batch(3)
    state, metrics = step(state, ok)
    assert int(state.step) == 1 and int(state.skipped) == 1


def test_equal_rewards_give_no_update_under_grpo():
    from jaxscaffold.rl.advantages import advantages
    adv = advantages(np.ones(8), np.repeat([0, 1], 4), preset("grpo"))
    np.testing.assert_array_equal(adv, 0.0)
    batch = _batch(4)
    batch["adv_B"] = np.asarray(adv, np.float32)
    sgd = optax.sgd(1.0)
    step = make_train_step(CONFIG, preset("grpo"), sgd)
    params = _params()
    state, _ = step(init_train_state(jax.tree.map(jnp.copy, params), sgd), batch)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_kl_needs_a_reference_and_reference_changes_the_loss():
    """The step's one signature, `(state, batch, frozen=None)`: with a KL term `frozen` is the
    reference, required; without one there is none to pass."""
    opt = optax.sgd(0.0)
    step = make_train_step(CONFIG, preset("grpo", kl_coef=0.1), opt)
    batch = _batch(5)
    with pytest.raises(ValueError, match="reference"):
        step(init_train_state(_params(), opt), batch)
    with pytest.raises(ValueError, match="no frozen parameters"):
        make_train_step(CONFIG, preset("grpo"), opt)(init_train_state(_params(), opt), batch, _params())
    _, m_same = step(init_train_state(_params(), opt), batch, _params())
    _, m_other = step(init_train_state(_params(), opt), batch, _params(seed=1))
    assert abs(float(m_same["kl"])) < 1e-6 and float(m_other["kl"]) > 1e-3


def test_equal_steps_share_their_compiled_program():
    """An OptimizerConfig names the optimizer by value: a step built again with an equal config
    (a new run in the same process) reuses the compiled program and updates exactly as the
    transformation its `make()` returns."""
    config = OptimizerConfig(lr=1e-2, warmup_steps=1)
    a, b = (make_train_step(CONFIG, preset("grpo"), OptimizerConfig(lr=1e-2, warmup_steps=1)) for _ in range(2))
    by_transformation = make_train_step(CONFIG, preset("grpo"), config.make())
    outs = []
    for step in (a, b, by_transformation):
        state = init_train_state(jax.tree.map(jnp.copy, _params()), config.make())
        for seed in (3, 4):  # past the warmup: the schedule and Adam's moments matter
            state, _ = step(state, _batch(seed))
        outs.append(state.params)
    assert list(a.programs.values())[0] is list(b.programs.values())[0]
    assert list(a.programs.values())[0] is not list(by_transformation.programs.values())[0]
    for p in outs[1:]:
        for x, y in zip(jax.tree.leaves(outs[0]), jax.tree.leaves(p)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# ----------------------------------------------------------------------------- LoRA

LORA = lora_lib.LoraConfig(rank=4, alpha=8.0, targets=("q", "v", "o", "gate", "down"))


def _adapters(seed=1, config=CONFIG, lora=LORA):
    """Random a and b (b not zero, so a's gradient is not zero either)."""
    ad = lora_lib.init_adapters(config, lora, jax.random.key(seed))
    keys = iter(jax.random.split(jax.random.key(seed + 100), len(lora.targets)))
    return {t: {"a": v["a"], "b": 0.3 * jax.random.normal(next(keys), v["b"].shape, v["b"].dtype)}
            for t, v in ad.items()}


def _lora_update(batch, base, adapters, n=1, algo="grpo", config=CONFIG, mesh=None):
    sgd = optax.sgd(1.0)  # the update is minus the gradient
    step = make_train_step(config, preset(algo, agg_constant=12.0), sgd, num_micro_batches=n, lora=LORA, mesh=mesh,
                           logprob_chunk=4)
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
    full = make_train_step(CONFIG, preset("grpo", agg_constant=12.0), sgd, logprob_chunk=4)
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
    step = make_train_step(CONFIG, preset("grpo", kl_coef=0.1), opt, lora=LORA)
    base, batch = _params(), _batch(5)
    zero = lora_lib.init_adapters(CONFIG, LORA, jax.random.key(0))
    _, m_zero = step(init_train_state(zero, opt), batch, base)
    _, m_other = step(init_train_state(_adapters(), opt), batch, base)
    assert abs(float(m_zero["kl"])) < 1e-6 and float(m_other["kl"]) > 1e-4
