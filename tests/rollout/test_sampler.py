"""The sampler against the model's own full forward (teacher forcing) and the math of sampling.
Greedy decoding and log-probs are checked for each architecture (Qwen3; Qwen2.5, "qwen2": q/k/v
biases, no q/k norms); the rest on Qwen3."""

import collections
import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxscaffold.backends import cpu
from jaxscaffold.models import config as model_config, hf_io, qwen3
from jaxscaffold.models.sharding import MeshConfig, make_mesh
from jaxscaffold.rollout.conversation import MultiTurn
from jaxscaffold.rollout.engine import Sampler
from jaxscaffold.rollout.sampling import GREEDY, SamplingConfig, sample, sampling_logits
from tests.models.hf_reference import make_hf_model

VOCAB = 320
STOP = (7,)
full_forward = jax.jit(qwen3.forward, static_argnums=1)
LAYOUTS = ["per_layer", "stacked"]  # the CPU default (unrolled, per-layer buffers) and scan


def _checkpoint(tmp_path_factory, model_type):
    path = tmp_path_factory.mktemp(f"{model_type}-ckpt")
    make_hf_model(vocab=VOCAB, hidden=64, inter=128, heads=4, kv_heads=2, head_dim=16, std=0.3,
                  model_type=model_type).save_pretrained(path)
    config, params = hf_io.load_pretrained(str(path))
    if model_type == "qwen2":
        assert config.qkv_bias and not config.qk_norm
    return config, params


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return _checkpoint(tmp_path_factory, "qwen3")


@pytest.fixture(scope="module", params=["qwen3", "qwen2"])
def each_model(request, tmp_path_factory):
    """The test's model of each architecture (Qwen3's is `model`)."""
    return request.getfixturevalue("model") if request.param == "qwen3" else _checkpoint(tmp_path_factory, "qwen2")


def teacher_forced_logprobs(params, config, ids):
    """log p(ids[t] | ids[:t]) for t >= 1 from one full forward."""
    logits = full_forward(params, config, jnp.asarray(ids, jnp.int32)[None])[0]
    logp = jax.nn.log_softmax(logits, -1)
    return np.asarray(jnp.take_along_axis(logp[:-1], jnp.asarray(ids[1:])[:, None], -1)[:, 0])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_greedy_equals_repeated_argmax_of_full_forward(each_model, layout):
    model = each_model
    config, params = model
    sampler = Sampler(config, batch_size=4, max_len=64, sampling=GREEDY, stop_ids=(), cache_dtype="float32",
                      layout=layout)
    params = sampler.prepare(params)
    rng = np.random.RandomState(0)
    prompts = {s: list(rng.randint(0, VOCAB, n)) for s, n in enumerate([9, 1, 5, 13])}
    state = sampler.extend(params, sampler.init_state(), prompts)
    state, out = sampler.generate(params, state, list(prompts), max_new_tokens=12, seeds=[0, 1, 2, 3])
    width = 32  # every sequence right-padded to one length: one compiled forward (causal, so padding after
    for slot, prompt in prompts.items():  # the last real token changes none of its logits)
        seq = list(prompt)
        for _ in range(12):  # repeated argmax of the full (uncached) forward
            tokens = np.zeros((1, width), np.int32)
            tokens[0, :len(seq)] = seq
            segments = (np.arange(width) < len(seq)).astype(np.int32)[None]
            logits = full_forward(model[1], config, jnp.asarray(tokens), segment_ids_BT=jnp.asarray(segments))
            seq.append(int(jnp.argmax(logits[0, len(seq) - 1])))
        assert list(out[slot].tokens) == seq[len(prompt):], slot
        assert out[slot].finish_reason == "length"


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-4), ("bfloat16", None)])
def test_logprobs_equal_teacher_forcing(each_model, dtype, tol, capsys):
    config, params = each_model
    cfg = config.replace(compute_dtype=dtype)
    sampler = Sampler(cfg, batch_size=3, max_len=64, sampling=SamplingConfig(temperature=1.0),
                      stop_ids=(), cache_dtype=dtype)
    rng = np.random.RandomState(1)
    prompts = {s: list(rng.randint(0, VOCAB, n)) for s, n in enumerate([4, 11, 7])}
    state = sampler.extend(params, sampler.init_state(), prompts)
    state, out = sampler.generate(params, state, list(prompts), max_new_tokens=20, seeds=[5, 6, 7])
    gaps = []
    for slot, prompt in prompts.items():
        seq = prompt + list(out[slot].tokens)
        ref = teacher_forced_logprobs(params, config, seq)[len(prompt) - 1:]  # f32 trainer
        gaps.append(np.max(np.abs(out[slot].logprobs - ref)))
    gap = max(gaps)
    with capsys.disabled():
        print(f"\n[sampler] {config.model_type}: max |sampler logprob - f32 teacher-forced logprob|, {dtype}: {gap:.2e}")
    if tol is not None:
        assert gap <= tol
    else:
        assert gap < 0.5  # bf16 is reported, and must still be the same distribution roughly


@pytest.mark.parametrize("layout", LAYOUTS)
def test_five_turns_of_extend_then_generate_equal_one_prefill(model, layout):
    config, params = model
    sampler = Sampler(config, batch_size=2, max_len=256, sampling=SamplingConfig(temperature=1.0),
                      stop_ids=STOP, cache_dtype="float32", layout=layout)
    mt = MultiTurn(sampler)
    rng = np.random.RandomState(2)
    mt.extend(params, {0: list(rng.randint(8, VOCAB, 6)), 1: list(rng.randint(8, VOCAB, 3))})
    for turn in range(5):
        mt.generate(params, [0, 1], max_new_tokens=10, seeds=[11, 12])
        if turn < 4:  # environment answers, of different lengths per row
            mt.extend(params, {0: list(rng.randint(8, VOCAB, 5)), 1: list(rng.randint(8, VOCAB, 9))})
    for slot, conv in mt.release([0, 1]).items():
        arr = conv.arrays()
        assert len(arr["ids"]) == len(arr["assistant_mask"]) == len(arr["logprobs"])
        assert arr["assistant_mask"].sum() > 5 and arr["assistant_mask"][0] == 0
        ref = teacher_forced_logprobs(params, config, arr["ids"])
        gen = arr["assistant_mask"][1:] == 1
        np.testing.assert_allclose(arr["logprobs"][1:][gen], ref[gen], atol=1e-4)
        # Greedy check of the tokens themselves: replaying with T=0 from the same history.
    greedy = Sampler(config, batch_size=1, max_len=256, sampling=GREEDY, stop_ids=STOP, cache_dtype="float32",
                     layout=layout)
    mt = MultiTurn(greedy)
    history = []
    mt.extend(params, {0: list(rng.randint(8, VOCAB, 4))})
    for turn in range(5):
        mt.generate(params, [0], max_new_tokens=6, seeds=[0])
        mt.extend(params, {0: list(rng.randint(8, VOCAB, 3))})
    ids = np.asarray(mt.conversations[0].ids)
    mask = np.asarray(mt.conversations[0].assistant_mask)
    logits = full_forward(params, config, jnp.asarray(ids)[None])[0]
    argmax = np.asarray(jnp.argmax(logits, -1))
    np.testing.assert_array_equal(ids[1:][mask[1:] == 1], argmax[:-1][mask[1:] == 1])


def test_prepared_parameters_decode_exactly_as_the_stacked_ones(model):
    """`prepare` (per-layer weights in column blocks) is a layout, not a different model:
    the same tokens and logprobs as stacked parameters converted inside the call, and as
    the scanned stacked layout, at temperature 1."""
    config, params = model
    outs = []
    for layout, blocks, prepare in (("per_layer", 2, True), ("per_layer", 2, False), ("per_layer", 1, True),
                                    ("stacked", 1, False)):
        sampler = Sampler(config, batch_size=3, max_len=64, sampling=SamplingConfig(temperature=1.0),
                          stop_ids=(), cache_dtype="float32", layout=layout, column_blocks=blocks)
        p = sampler.prepare(params) if prepare else params
        assert cpu.is_prepared(p) == (layout == "per_layer" and prepare)
        prompts = {0: [5, 6, 7], 1: [8] * 9, 2: [9, 10]}
        state = sampler.extend(p, sampler.init_state(), prompts)
        _, out = sampler.generate(p, state, [0, 1, 2], max_new_tokens=12, seeds=[1, 2, 3])
        outs.append(out)
    for out in outs[1:]:
        for slot in range(3):
            np.testing.assert_array_equal(out[slot].tokens, outs[0][slot].tokens)
            np.testing.assert_allclose(out[slot].logprobs, outs[0][slot].logprobs, atol=1e-5)  # dot order


def test_decoding_through_growing_windows_equals_the_full_forward(model, monkeypatch):
    """per_layer calls attend over the smallest window bucket of a 700-slot cache that holds
    every row; one generate crosses windows in chunks. Tokens equal those of the stacked layout
    (one call over the whole cache), logprobs equal teacher forcing, and the cache beyond the
    window is never needed."""
    from jaxscaffold.rollout import engine
    config, params = model
    windows = []
    decode = engine._decode
    monkeypatch.setattr(engine, "_decode", lambda *a, **kw: windows.append(kw["window"]) or decode(*a, **kw))
    samplers = [Sampler(config, batch_size=2, max_len=700, sampling=SamplingConfig(temperature=1.0), stop_ids=(),
                        cache_dtype="float32", layout=layout, window_buckets=whole)
                for layout, whole in (("per_layer", None), ("stacked", (700,)))]
    assert samplers[0].window_buckets == (128, 192, 256, 384, 512, 700)
    outs = []
    for sampler in samplers:
        p = sampler.prepare(params)
        rng = np.random.RandomState(4)
        mt = MultiTurn(sampler)
        mt.extend(p, {0: list(rng.randint(8, VOCAB, 20)), 1: list(rng.randint(8, VOCAB, 3))})
        mt.generate(p, [0, 1], max_new_tokens=120, seeds=[1, 2])  # slot 0: 20 -> 140, windows 128, 192
        mt.extend(p, {0: list(rng.randint(8, VOCAB, 230))})  # slot 0 now at 370: window 384
        mt.generate(p, [0, 1], max_new_tokens=16, seeds=[3, 4])  # slot 0 fills 384: then 512
        outs.append(mt.release([0, 1]))
    assert windows == [128, 192, 384, 512, 700, 700]
    for slot, conv in outs[0].items():
        arr = conv.arrays()
        np.testing.assert_array_equal(arr["ids"], outs[1][slot].arrays()["ids"])
        ref = teacher_forced_logprobs(params, config, arr["ids"])
        gen = arr["assistant_mask"][1:] == 1
        assert gen.sum() == 136
        np.testing.assert_allclose(arr["logprobs"][1:][gen], ref[gen], atol=1e-4)


def test_stop_tokens_end_a_row_and_are_kept(model):
    config, params = model
    sampler = Sampler(config, batch_size=2, max_len=128, sampling=SamplingConfig(temperature=1.0),
                      stop_ids=tuple(range(0, 40)), cache_dtype="float32")  # common enough to hit
    state = sampler.extend(params, sampler.init_state(), {0: [50, 60], 1: [70]})
    state, out = sampler.generate(params, state, [0, 1], max_new_tokens=64, seeds=[1, 2])
    for g in out.values():
        if g.finish_reason == "stop":
            assert g.tokens[-1] < 40 and all(t >= 40 for t in g.tokens[:-1])
        else:
            assert len(g.tokens) == 64
    assert any(g.finish_reason == "stop" for g in out.values())
    np.testing.assert_array_equal(sampler.lengths(state), [2 + len(out[0].tokens), 1 + len(out[1].tokens)])


def test_row_is_reproducible_from_its_seed_in_any_slot(model):
    """Continuous batching: a slot released and refilled, rows waiting while others decode."""
    config, params = model
    sampler = Sampler(config, batch_size=3, max_len=128, sampling=SamplingConfig(temperature=1.0, top_p=0.9),
                      stop_ids=(), cache_dtype="float32")
    prompt = [10, 20, 30, 40]
    alone = sampler.extend(params, sampler.init_state(), {0: prompt})
    _, ref = sampler.generate(params, alone, [0], max_new_tokens=8, seeds=[99])
    mt = MultiTurn(sampler)
    mt.extend(params, {0: [1, 2, 3], 1: [4, 5, 6, 7, 8], 2: [9]})
    mt.generate(params, [0, 1, 2], max_new_tokens=5, seeds=[1, 2, 3])
    mt.release([1])
    mt.extend(params, {1: prompt})  # slot 1 refilled with the reference episode
    out = mt.generate(params, [1, 2], max_new_tokens=8, seeds=[99, 4])  # slot 0 waits
    np.testing.assert_array_equal(out[1].tokens, ref[0].tokens)
    np.testing.assert_allclose(out[1].logprobs, ref[0].logprobs, atol=1e-6)
    assert len(mt.conversations[0]) == 3 + 5  # the waiting slot was not touched


@contextlib.contextmanager
def traced_programs():
    """Counts the sampler programs (prefill, decode) traced inside the block: each is a compile."""
    counts = collections.Counter()

    def listener(event, duration, **kw):
        if event == "/jax/core/compile/jaxpr_trace_duration" and kw.get("fun_name") in ("_prefill", "_decode"):
            counts[kw["fun_name"]] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield counts
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def _multi_turn_run(sampler, params):
    mt = MultiTurn(sampler)
    rng = np.random.RandomState(3)
    for episode in range(3):
        mt.extend(params, {0: list(rng.randint(8, VOCAB, rng.randint(1, 40))), 1: list(rng.randint(8, VOCAB, 5))})
        for turn in range(4):
            mt.generate(params, [0, 1], max_new_tokens=int(rng.randint(1, 30)), seeds=[episode, turn])
            mt.extend(params, {0: list(rng.randint(8, VOCAB, rng.randint(1, 20)))})
        mt.release([0, 1])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_compilations_are_bounded_in_a_multi_turn_run(model, layout):
    config, params = model
    # Stop ids of this test only: no other test has compiled these programs.
    make = lambda: Sampler(config, batch_size=2, max_len=256, sampling=SamplingConfig(temperature=1.0),  # noqa: E731
                           stop_ids=STOP + (VOCAB - 1,), cache_dtype="float32", prefill_buckets=(16, 64, 255),
                           decode_buckets=(32,), layout=layout)
    sampler = make()
    params = sampler.prepare(params)
    with traced_programs() as first:
        _multi_turn_run(sampler, params)
    # At most one program per (length bucket, window) pair. Both layouts: decode windows 128,
    # 192, 256 and prefill windows 128, 256 (the powers of two).
    assert sampler.window_buckets == (128, 192, 256)
    decode_windows, prefill_windows = 3, 2
    assert 1 <= first["_prefill"] <= 3 * prefill_windows and 1 <= first["_decode"] <= decode_windows, first
    # A sampler with the same settings (a new training run in the same process) compiles nothing.
    with traced_programs() as again:
        _multi_turn_run(make(), params)
    assert sum(again.values()) == 0, again


def test_context_overflow_is_a_clear_error(model):
    from jaxscaffold.rollout.engine import ContextOverflow
    config, params = model
    sampler = Sampler(config, batch_size=1, max_len=32, sampling=GREEDY, stop_ids=())
    state = sampler.extend(params, sampler.init_state(), {0: list(range(20))})
    with pytest.raises(ContextOverflow, match="slot 0"):
        sampler.extend(params, state, {0: list(range(12))})
    state, out = sampler.generate(params, state, [0], max_new_tokens=50, seeds=[0])
    assert len(out[0].tokens) == 32 - 1 - 20 and out[0].finish_reason == "length"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sharded_sampling_equals_unsharded(model, layout):
    config, params = model
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    from jaxscaffold.models.qwen3 import param_shardings
    sharded_params = jax.device_put(params, param_shardings(config, mesh))
    prompts = {s: [s + 10, 2 * s + 11, 30] for s in range(4)}
    results = []
    for p, m in ((params, None), (sharded_params, mesh)):
        sampler = Sampler(config, batch_size=4, max_len=64, sampling=SamplingConfig(temperature=0.8),
                          stop_ids=(), cache_dtype="float32", mesh=m, layout=layout)
        p = sampler.prepare(p)
        state = sampler.extend(p, sampler.init_state(), prompts)
        state, out = sampler.generate(p, state, list(prompts), max_new_tokens=10, seeds=[1, 2, 3, 4])
        if m is not None:  # rows over the batch axes, kv heads over tensor
            rows_heads = (("data", "fsdp"), "tensor", None, None)
            for k in (state.cache.k if layout == "per_layer" else [state.cache.k]):
                expected = rows_heads if layout == "per_layer" else (None,) + rows_heads
                want = jax.sharding.NamedSharding(m, jax.sharding.PartitionSpec(*expected))
                assert k.sharding.is_equivalent_to(want, k.ndim), k.sharding
        results.append(out)
    for s in prompts:
        np.testing.assert_array_equal(results[0][s].tokens, results[1][s].tokens)
        np.testing.assert_allclose(results[0][s].logprobs, results[1][s].logprobs, atol=1e-5)


# ----------------------------------------------------------------------------- sampling math


@pytest.mark.parametrize("vocab", [12, 2500])  # 2500: three inverse-CDF blocks, the last padded
@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 1.0, 0), (0.7, 1.0, 0), (1.0, 0.8, 0), (0.7, 0.6, 0), (1.0, 1.0, 4)])
def test_empirical_distribution_matches_softmax(temperature, top_p, top_k, vocab):
    rng = np.random.RandomState(0)
    scale = 1.5 if vocab == 12 else 4.0  # peaked, so top-p keeps a few hundred of the 2500
    logits = jnp.asarray(rng.randn(vocab) * scale, jnp.float32)
    n = 40_000
    cfg = SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k)
    keys, logits_NV = jax.random.split(jax.random.key(1234), n), jnp.broadcast_to(logits, (n, vocab))
    # 10^8 logits: this program's run time, not its compile time, dominates, so it is compiled
    # with LLVM's optimisations (the suite's default is -O0, tests/conftest.py): 3x faster.
    compiled = jax.jit(sample, static_argnums=2).lower(logits_NV, keys, cfg).compile(
        {"xla_backend_optimization_level": 3})
    tokens, policy_lp, sampled_lp = compiled(logits_NV, keys)
    # Independent reference, in NumPy from the definitions.
    z = np.asarray(logits, np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p)
    keep = np.zeros(vocab, bool)
    mass = 0.0
    for i in order:
        if mass < top_p:
            keep[i] = True
        mass += p[i]
    if top_k:
        keep &= np.isin(np.arange(vocab), order[:top_k])
    expected = np.where(keep, p, 0.0)
    expected /= expected.sum()
    counts = np.bincount(np.asarray(tokens), minlength=vocab)
    assert counts[~keep].sum() == 0
    # Pool the rare tokens (expected count < 5) into one cell, as the chi-square test needs.
    rare = keep & (expected * n < 5)
    obs = np.append(counts[keep & ~rare], counts[rare].sum())
    exp = np.append(expected[keep & ~rare], expected[rare].sum()) * n
    if not rare.any():
        obs, exp = obs[:-1], exp[:-1]
    chi2, pval = stats.chisquare(obs, exp)
    assert pval > 1e-3, (chi2, pval)
    # Policy logprob is always the untruncated T=1 one; sampled logprob is of `expected`.
    full = np.log(np.exp(np.asarray(logits, np.float64) - np.asarray(logits).max()) /
                  np.exp(np.asarray(logits, np.float64) - np.asarray(logits).max()).sum())
    np.testing.assert_allclose(np.asarray(policy_lp), full[np.asarray(tokens)], atol=1e-5)
    np.testing.assert_allclose(np.asarray(sampled_lp), np.log(expected[np.asarray(tokens)]), atol=1e-5)


def test_top_p_threshold_equals_the_sorted_definition():
    """The bisection over probability bits keeps exactly the sorted definition's set (the
    smallest prefix whose mass reaches top_p, ties at its edge included), on many rows."""
    rng = np.random.RandomState(7)
    logits = rng.randn(64, 3000) * rng.uniform(0.5, 6, (64, 1))
    logits[:4, :10] = logits[:4, :1]  # ties
    for top_p in (0.05, 0.5, 0.9, 0.999):
        out = np.asarray(sampling_logits(jnp.asarray(logits, jnp.float32), SamplingConfig(1.0, top_p=top_p)))
        p = np.asarray(jax.nn.softmax(jnp.asarray(logits, jnp.float32), -1), np.float64)
        for row in range(64):
            desc = np.sort(p[row])[::-1]
            before = np.cumsum(desc) - desc
            threshold = desc[before < top_p].min()
            np.testing.assert_array_equal(np.isfinite(out[row]), p[row] >= threshold, err_msg=f"{row} {top_p}")


def test_top_k_keeps_the_k_largest_logits_ties_included():
    """The bisection over float keys finds each row's k-th largest logit as a sort does: with
    negative, tied and infinite logits, for k from 1 to the whole vocabulary."""
    rng = np.random.RandomState(3)
    logits = (rng.randn(32, 700) * rng.uniform(0.1, 8, (32, 1))).astype(np.float32)
    logits[0, :20] = logits[0, 0]  # ties at the edge: all kept
    logits[1] = -2.5  # one value throughout
    logits[2, :7] = -np.inf
    logits[3, :3] = np.inf
    logits[4] = -np.abs(logits[4])  # all negative
    for k in (1, 2, 4, 20, 699, 700, 1000):
        out = np.asarray(sampling_logits(jnp.asarray(logits), SamplingConfig(1.0, top_k=k)))
        kth = np.sort(logits, axis=-1)[:, ::-1][:, min(k, 700) - 1]
        np.testing.assert_array_equal(out, np.where(logits >= kth[:, None], logits, -np.inf), err_msg=str(k))


def test_top_p_keeps_at_least_the_most_likely_token():
    logits = jnp.asarray([[5.0, 0.0, -1.0]])
    out = sampling_logits(logits, SamplingConfig(temperature=1.0, top_p=0.01))
    assert np.isfinite(np.asarray(out)[0, 0]) and np.all(np.isinf(np.asarray(out)[0, 1:]))


def test_stop_ids_are_required_and_must_be_in_the_vocabulary():
    """A default (Qwen3's end ids) once let word-vocabulary runs decode past every end."""
    small = model_config.tiny().replace(vocab_size=64)
    with pytest.raises(TypeError):
        Sampler(small, batch_size=1, max_len=32)
    with pytest.raises(ValueError, match=r"stop ids \[151643, 151645\] are outside"):
        Sampler(small, batch_size=1, max_len=32, stop_ids=(151645, 151643))
    assert list(Sampler(small, batch_size=1, max_len=32, stop_ids=(2, 0)).stop_ids) == [0, 2]
