"""The paged KV cache of the stacked sampler: the contiguous cache's tokens through page
boundaries, slot reuse and multi-turn extends; every page back in the pool after a run; a
pool too small ends rows truncated ("pages", counted), never on another row's values; the
TPU's Pallas kernel, in interpret mode, prefills, extends and decodes the contiguous cache's
tokens."""

import os

import jax
import numpy as np
import pytest

from jaxscaffold import config as config_lib
from jaxscaffold.backends.accelerator import Accelerator
from jaxscaffold.models import config as model_configs
from jaxscaffold.models import paged_kernel, qwen3
from jaxscaffold.rollout.engine import ContextOverflow, Sampler, SamplerOptions
from jaxscaffold.rollout.pages import PageTable
from jaxscaffold.rollout.sampling import GREEDY
from jaxscaffold.train.job_spec import JobSpec

PAGE = 16
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def tiny():
    config = model_configs.tiny(vocab_size=512)  # token ids only: a small vocabulary keeps the LM head cheap
    params = qwen3.init_params(config, jax.random.key(3))
    return config, jax.tree.map(lambda x: x * 8 if x.ndim > 1 else x, params)  # sharper than uniform


def _sampler(config, **options):
    # Greedy: the paged read sums its softmax in another order than the contiguous one (f32
    # rounding), which can flip a token sampled at temperature 1, not an argmax.
    options.setdefault("cache_dtype", "float32")  # both caches hold the same values
    return Sampler(config, batch_size=2, max_len=128, stop_ids=(),
                   options=SamplerOptions(sampling=GREEDY, layout="stacked", **options))


def _episodes(sampler, params):
    """Slot 0: a 30-token prompt, 40 tokens (pages 2 -> 5), a 25-token observation, 30 more.
    Slot 1: 3 tokens and 40, then released and refilled (its pages reused by a new row of 20
    tokens) and 30 more. Returns the generations and the page count after each call."""
    rng = np.random.RandomState(7)
    vocab = sampler.config.vocab_size
    prompt = lambda n: list(rng.randint(0, vocab, n))  # noqa: E731
    pages = []
    state = sampler.extend(params, sampler.init_state(), {0: prompt(30), 1: prompt(3)})
    state, first = sampler.generate(params, state, [0, 1], max_new_tokens=40, seeds=[1, 2])
    if sampler.paged:
        pages.append(sampler.page_table.used)
    state = sampler.release(state, [1])
    state = sampler.extend(params, state, {0: prompt(25), 1: prompt(20)})
    state, second = sampler.generate(params, state, [0, 1], max_new_tokens=30, seeds=[3, 4])
    lengths = sampler.lengths(state)
    if sampler.paged:
        pages.append(sampler.page_table.used)
    state = sampler.release(state, [0, 1])
    return [first, second], lengths, pages, state


@pytest.mark.slow
def test_paged_tokens_equal_the_contiguous_caches_and_no_page_leaks(tiny):
    config, params = tiny
    ref, ref_lengths, _, _ = _episodes(_sampler(config), params)
    paged = _sampler(config, kv_cache="paged", page_size=PAGE)
    got, lengths, pages, _ = _episodes(paged, params)
    np.testing.assert_array_equal(lengths, ref_lengths)
    assert list(lengths) == [30 + 40 + 25 + 30, 20 + 30]
    for turn_ref, turn in zip(ref, got):
        for slot in (0, 1):
            np.testing.assert_array_equal(turn[slot].tokens, turn_ref[slot].tokens)
            np.testing.assert_allclose(turn[slot].logprobs, turn_ref[slot].logprobs, rtol=1e-4, atol=1e-4)
            assert turn[slot].finish_reason == "length"
    # Each row holds ceil(length / page) pages between calls; all go back when released.
    assert pages == [-(-70 // PAGE) + -(-43 // PAGE), -(-125 // PAGE) + -(-50 // PAGE)]
    assert paged.page_table.used == 0 and sorted(paged.page_table.free) == list(range(1, paged.kv_pages))
    assert paged.rows_out_of_pages == 0


def test_a_pool_too_small_ends_rows_truncated_and_counted(tiny):
    """Five pages (and the scratch page) for two rows of 20 prompt tokens that would decode 40:
    the rows stop where their pages end, finish_reason "pages", with the tokens the
    contiguous cache decodes up to there (no row reads another's values); a prompt the pool
    cannot hold raises ContextOverflow and takes no page."""
    config, params = tiny
    rng = np.random.RandomState(5)
    prompts = {slot: list(rng.randint(0, config.vocab_size, 20)) for slot in (0, 1)}
    outs = {}
    for name, options in (("contiguous", {}), ("paged", dict(kv_cache="paged", page_size=PAGE, kv_pages=6))):
        sampler = _sampler(config, **options)
        state = sampler.extend(params, sampler.init_state(), prompts)
        state, outs[name] = sampler.generate(params, state, [0, 1], max_new_tokens=40, seeds=[1, 2])
        if name == "paged":
            # Row 0 took the one free page (3 pages: 48 tokens), row 1 none (2 pages: 32).
            assert [len(outs[name][s].tokens) for s in (0, 1)] == [48 - 20, 32 - 20]
            assert [outs[name][s].finish_reason for s in (0, 1)] == ["pages", "pages"]
            assert sampler.rows_out_of_pages == 2 and sampler.page_table.used == 5
            assert [sampler.room(s, n) for s, n in enumerate(sampler.lengths(state))] == [0, 0]
            state = sampler.release(state, [1])
            with pytest.raises(ContextOverflow, match="pages"):
                sampler.extend(params, state, {1: list(range(40))})  # 3 pages, 2 free
            assert sampler.page_table.used == 3
    for slot in (0, 1):
        n = len(outs["paged"][slot].tokens)
        np.testing.assert_array_equal(outs["paged"][slot].tokens, outs["contiguous"][slot].tokens[:n])


def test_multi_turn_ends_a_turn_out_of_pages_and_reports_no_room(tiny):
    """`MultiTurn.decode` in chunks over the pool of the test above: both turns end, "pages",
    where the rows' pages end, and the slots report no room (the agent ends such an episode
    truncated)."""
    from jaxscaffold.rollout.conversation import MultiTurn
    config, params = tiny
    rng = np.random.RandomState(5)
    mt = MultiTurn(_sampler(config, kv_cache="paged", page_size=PAGE, kv_pages=6))
    mt.extend(params, {slot: list(rng.randint(0, config.vocab_size, 20)) for slot in (0, 1)})
    ended = {}
    for _ in range(10):  # 40-token turns in chunks of 16: ended within a few calls
        turns = {slot: (40, slot + 1) for slot in (0, 1) if slot not in ended}
        if not turns:
            break
        ended.update(mt.decode(params, turns, chunk=16))
    assert {slot: (gen.finish_reason, len(gen.tokens)) for slot, gen in ended.items()} == {0: ("pages", 28),
                                                                                        1: ("pages", 12)}
    assert [mt.room(slot) for slot in (0, 1)] == [0, 0] and mt.sampler.rows_out_of_pages == 2


@pytest.mark.slow
def test_the_tpu_kernel_in_interpret_mode_gives_the_contiguous_caches_tokens(tiny, monkeypatch):
    """The TPU backend's paged read (the Pallas kernel, `paged_kernel`, run by the Pallas
    interpreter on CPU), in prefill, multi-turn extends and decode, f32 pages: the contiguous
    cache's tokens through page boundaries and slot reuse, the same pages held."""
    config, params = tiny
    monkeypatch.setattr(paged_kernel, "INTERPRET", True)
    queries = []  # queries a row of each traced call: prefill / extends (many) and decode (1)
    kernel = paged_kernel.paged_attention
    monkeypatch.setattr(paged_kernel, "paged_attention", lambda q, *a, **kw: queries.append(q.shape[1]) or kernel(q, *a, **kw))
    ref, ref_lengths, _, _ = _episodes(_sampler(config), params)
    backend = Accelerator(platform="tpu", kv_cache="paged", page_size=PAGE)
    assert backend.paged_read() == "pallas" and Accelerator(platform="gpu").paged_read() == "gather"
    sampler = _sampler(config, backend=backend)
    got, lengths, pages, _ = _episodes(sampler, params)
    assert 1 in queries and max(queries) > 1  # the kernel read decode and prefill
    np.testing.assert_array_equal(lengths, ref_lengths)
    for turn_ref, turn in zip(ref, got):
        for slot in (0, 1):
            np.testing.assert_array_equal(turn[slot].tokens, turn_ref[slot].tokens)
            np.testing.assert_allclose(turn[slot].logprobs, turn_ref[slot].logprobs, rtol=1e-4, atol=1e-4)
    assert pages == [-(-70 // PAGE) + -(-43 // PAGE), -(-125 // PAGE) + -(-50 // PAGE)]
    assert sampler.page_table.used == 0


def test_page_table_accounting():
    table = PageTable(slots=3, pages=8, page_size=4, width=3)
    assert table.grow(0, 5) == 8 and table.grow(1, 12) == 12  # 2 pages, 3 pages (its whole table)
    assert table.grow(2, 12) == 8  # the pool's last 2 pages
    held = [p for pages in table.held for p in pages]
    assert sorted(held) == list(range(1, 8)) and table.free == []  # every page once; never the scratch page 0
    assert table.room(0, 5) == 3 and table.room(1, 12) == 0
    table.shrink(1, 5)  # keeps ceil(5 / 4) = 2 pages
    assert table.held[1] == held[2:4] and list(table.table[1]) == held[2:4] + [0]
    assert table.room(0, 5) == 7  # its spare 3 slots and the freed page
    for slot in range(3):
        table.release(slot)
    assert table.used == 0 and sorted(table.free) == list(range(1, 8)) and not table.table.any()
    with pytest.raises(ValueError, match="scratch"):
        PageTable(slots=1, pages=1, page_size=4, width=1)


def test_a_page_table_split_into_data_shards():
    """Slots 0-1 on shard 0 (pages 0-3, 0 its scratch), slots 2-3 on shard 1 (pages 4-7,
    4 its scratch): a slot takes its own shard's pages only, and runs out with its shard."""
    table = PageTable(slots=4, pages=8, page_size=4, width=4, shards=2)
    assert [table.shard(s) for s in range(4)] == [0, 0, 1, 1]
    assert list(table.table[:, 0]) == [0, 0, 4, 4]  # unfilled entries: the shard's scratch page
    assert table.grow(2, 16) == 12 and table.held[2] == [5, 6, 7]  # its shard's 3 pages, not shard 0's
    assert table.room(3, 0) == 0 and table.grow(3, 1) == 0  # shard 1 is empty ...
    assert table.room(0, 0) == 12 and table.grow(0, 5) == 8 and table.held[0] == [1, 2]  # ... shard 0 is not
    table.release(2)
    assert list(table.table[2]) == [4] * 4 and table.used == 2 and sorted(table.free) == [3, 5, 6, 7]
    for bad in (dict(slots=3, pages=8), dict(slots=4, pages=9), dict(slots=4, pages=2)):
        with pytest.raises(ValueError):
            PageTable(page_size=4, width=4, shards=2, **bad)


def test_the_config_chooses_the_cache():
    base = lambda: config_lib.load_file(os.path.join(ROOT, "configs", "base.py"))  # noqa: E731 (overrides change it)
    cfg = config_lib.from_configdict(config_lib.parse_overrides(
        base(), ["rollout.kv_cache=paged", "rollout.page_size=128", "rollout.kv_pages=1000"]))
    spec = JobSpec.from_config(cfg, processes=1)
    options = spec.sampler.options
    assert (options.kv_cache, options.page_size, options.kv_pages) == ("paged", 128, 1000)
    assert spec.eval_sampler.options.kv_cache == "paged"
    for bad, match in (("rollout.kv_cache=ragged", "kv_cache"), ("rollout.kv_pages=1", "kv_pages"),
                       ("rollout.page_size=0", "page_size")):
        with pytest.raises(config_lib.ConfigError, match=match):
            config_lib.from_configdict(config_lib.parse_overrides(base(), [bad]))
    with pytest.raises(ValueError, match="stacked"):
        Sampler(model_configs.tiny(), batch_size=1, max_len=64, stop_ids=(),
                options=SamplerOptions(layout="per_layer", kv_cache="paged"))


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["portable", "tpu"])
def test_one_page_pool_per_data_shard(tiny, monkeypatch, platform):
    """On a 4 x 2 (data x tensor) mesh of the 8 fake devices: the pool's pages split over
    `data` with the rows, kv heads over `tensor`; each row holds pages of its own shard's part
    only; the tokens are the unsharded sampler's, with the gather read ("portable") and with
    the TPU kernel in interpret mode, each device reading its own pages under shard_map."""
    from jaxscaffold.models.sharding import MeshConfig, make_mesh
    monkeypatch.setattr(paged_kernel, "INTERPRET", True)
    config, params = tiny
    mesh = make_mesh(MeshConfig(data=4, fsdp=1, tensor=2), jax.devices()[:8])
    backend = Accelerator(platform=platform, kv_cache="paged", page_size=PAGE)
    outs, tables = [], []
    for p, m in ((params, None), (jax.device_put(params, qwen3.param_shardings(config, mesh)), mesh)):
        sampler = Sampler(config, batch_size=8, max_len=64, stop_ids=(), mesh=m,
                          options=SamplerOptions(sampling=GREEDY, layout="stacked", cache_dtype="float32", backend=backend))
        state = sampler.extend(p, sampler.init_state(), {s: [s + 10, 2 * s + 11] * (2 + 3 * s) for s in range(8)})
        state, out = sampler.generate(p, state, list(range(8)), max_new_tokens=10, seeds=list(range(8)))
        outs.append(out)
        tables.append(sampler.page_table)
    table = tables[1]
    assert table.shards == 4 and table.pages == 8 * 4 + 4  # each row's max_len, a scratch page a shard
    per = table.pages // 4
    for slot in range(8):  # rows 2s, 2s + 1 on data shard s, their pages in its part
        assert table.held[slot] and all(slot // 2 * per < page < (slot // 2 + 1) * per for page in table.held[slot])
    want = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "tensor", ("data", "fsdp")))
    assert state.cache.k.sharding.is_equivalent_to(want, 5), state.cache.k.sharding
    for s in range(8):
        np.testing.assert_array_equal(outs[0][s].tokens, outs[1][s].tokens)
        np.testing.assert_allclose(outs[0][s].logprobs, outs[1][s].logprobs, atol=1e-4)
    # The paged read and write run per device (under shard_map), on the device's own pages.
    assert "manual_computation" in sampler.lower_decode(sampler.prepare(p), state, window=64).as_text()


@pytest.mark.slow
def test_a_sharded_paged_sampler_equals_the_unsharded_one(tiny):
    """Kv heads over `tensor`, rows (and their page tables) and the pool's pages over the
    batch axes: the unsharded paged sampler's tokens, the pool keeping its sharding."""
    from jaxscaffold.models.sharding import MeshConfig, make_mesh
    config, params = tiny
    mesh = make_mesh(MeshConfig(data=2, fsdp=1, tensor=2), jax.devices()[:4])
    outs = []
    for p, m in ((params, None), (jax.device_put(params, qwen3.param_shardings(config, mesh)), mesh)):
        sampler = Sampler(config, batch_size=4, max_len=128, stop_ids=(), mesh=m,
                          options=SamplerOptions(sampling=GREEDY, layout="stacked", kv_cache="paged", page_size=PAGE))
        state = sampler.extend(p, sampler.init_state(), {s: [s + 10, 2 * s + 11] * (5 + 5 * s) for s in range(4)})
        state, out = sampler.generate(p, state, list(range(4)), max_new_tokens=12, seeds=[1, 2, 3, 4])
        if m is not None:
            want = jax.sharding.NamedSharding(m, jax.sharding.PartitionSpec(None, "tensor", ("data", "fsdp")))
            assert state.cache.k.sharding.is_equivalent_to(want, 5), state.cache.k.sharding
        outs.append(out)
    for s in range(4):
        np.testing.assert_array_equal(outs[0][s].tokens, outs[1][s].tokens)
        np.testing.assert_allclose(outs[0][s].logprobs, outs[1][s].logprobs, atol=1e-4)
