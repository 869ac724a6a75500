"""A call that serves few slots runs on those rows alone (`SamplerOptions(row_buckets=...)`): the same
tokens, log-probs, logits and cache as the same call on every slot, bit for bit, and the other
slots untouched. A prefill gathers down to one row and splits rows of different widths into the
calls that cost least (`Sampler.prefill_calls`), with the same numbers."""

import itertools

import jax
import numpy as np
import pytest

from jaxscaffold.models import config as model_config, qwen3
from jaxscaffold.rollout.engine import Sampler, SamplerOptions
from jaxscaffold.rollout.sampling import SamplingConfig

CONFIG = model_config.tiny(vocab_size=1024)  # token ids below 1000: a small vocabulary keeps the LM head cheap
STOP = (1023,)  # the last id, never in a prompt


def _arrays(state):
    return [np.asarray(x) for x in jax.tree.leaves(state)]


@pytest.mark.slow  # compiles the prefill and decode programs at three batch sizes
@pytest.mark.default_emitters
@pytest.mark.parametrize("layout", ["per_layer", "stacked"])
def test_few_rows_run_alone_as_on_all_slots(layout):
    params = qwen3.init_params(CONFIG, jax.random.key(0))
    rng = np.random.default_rng(0)
    prompts = {s: list(rng.integers(0, 1000, size=int(n))) for s, n in enumerate(rng.integers(5, 40, size=16))}
    observations = {3: [11, 12, 13], 9: list(range(20, 45)), 14: [7]}
    first = {15: list(rng.integers(0, 1000, size=150))}  # slot 15 restarts: a long first prompt beside them

    def run(row_buckets):
        sampler = Sampler(CONFIG, stop_ids=STOP, batch_size=16, max_len=256,
                          options=SamplerOptions(layout=layout, sampling=SamplingConfig(temperature=1.0),
                                                 cache_dtype="float32", row_buckets=row_buckets))
        p = sampler.prepare(params)
        state = sampler.extend(p, sampler.init_state(), prompts)
        before = _arrays(state)
        state = sampler.release(state, [15])
        # 4 of 16 slots: where prefills gather (per_layer), in two calls: the 150-token prompt with the 25-token
        # observation (width 256, 2 rows: one row, or fewer than 64 tokens, would round
        # differently on XLA:CPU), the two short observations in the other (width 16, 4 rows)
        state = sampler.extend(p, state, {**observations, **first})
        state = sampler.extend(p, state, {5: [1, 2], 6: [3]})  # 2 rows 16 wide: a batch of 4 (64 tokens)
        state, gens = sampler.generate(p, state, [14, 3, 9], max_new_tokens=[12, 20, 5], seeds=[1, 2, 3])
        state, more = sampler.generate(p, state, list(range(10)), max_new_tokens=6, seeds=list(range(10)))  # 10: 16
        return sampler, before, _arrays(state), gens, more

    sampler, before, alone, gens, more = run((4, 8, 16))
    _, _, every, gens_all, more_all = run((16,))
    lengths = np.asarray([len(prompts[s]) for s in range(15)] + [0])
    new = {s: len(t) for s, t in {**observations, **first}.items()}
    if layout == "per_layer":
        assert sampler.row_buckets == (4, 8, 16) and sampler.prefill_row_buckets == (2, 4, 8, 16)
        assert sorted(map(sorted, sampler.prefill_calls(new, lengths))) == [[3, 14], [9, 15]]
    else:  # the stacked layout: gathered prefills in row_buckets, never split
        assert sampler.prefill_row_buckets == (4, 8, 16) and sampler.prefill_calls(new, lengths) == [list(new)]
    assert list(gens) == [14, 3, 9] and [len(gens[s].tokens) for s in (3, 9)] == [20, 5]
    for a, b in zip(alone, every):
        np.testing.assert_array_equal(a, b)
    for got, want in ((gens, gens_all), (more, more_all)):
        for s in want:
            np.testing.assert_array_equal(got[s].tokens, want[s].tokens)
            np.testing.assert_array_equal(got[s].logprobs, want[s].logprobs)
            assert got[s].finish_reason == want[s].finish_reason
    # the slots no call served (10..15 but 14) kept their segments and lengths ([B, S] and [B]
    # in both layouts: the leaves before the logits)
    untouched = [10, 11, 12, 13]
    for a, b in zip(alone[-3:-1], before[-3:-1]):
        np.testing.assert_array_equal(a[untouched], b[untouched])
    assert [int(alone[-2][s]) for s in untouched] == [len(prompts[s]) for s in untouched]


def test_row_buckets_default_and_checks():
    assert Sampler(CONFIG, stop_ids=STOP, batch_size=64, max_len=128, options=SamplerOptions(layout="per_layer")).row_buckets == (8, 16, 32, 64)
    assert Sampler(CONFIG, stop_ids=STOP, batch_size=64, max_len=128, options=SamplerOptions(layout="stacked")).row_buckets == (64,)
    assert Sampler(CONFIG, stop_ids=STOP, batch_size=6, max_len=128, options=SamplerOptions(layout="per_layer")).row_buckets == (6,)
    assert Sampler(CONFIG, stop_ids=STOP, batch_size=64, max_len=128,
                   options=SamplerOptions(layout="per_layer")).prefill_row_buckets == (2, 4, 8, 16, 32, 64)
    assert Sampler(CONFIG, stop_ids=STOP, batch_size=6, max_len=128, options=SamplerOptions(layout="per_layer")).prefill_row_buckets == (6,)
    with pytest.raises(ValueError, match="row_buckets"):
        Sampler(CONFIG, stop_ids=STOP, batch_size=16, max_len=128, options=SamplerOptions(row_buckets=(4, 8)))
    with pytest.raises(ValueError, match="prefill_row_buckets"):
        Sampler(CONFIG, stop_ids=STOP, batch_size=16, max_len=128, options=SamplerOptions(prefill_row_buckets=(0, 16)))


def _call_cost(sampler, new, lengths, call):
    """A call's cost as `prefill_calls` documents it: batch x width x window + the fixed
    `prefill_call_cost`, the batch at least 2 rows and 64 tokens (below all 16 slots)."""
    fit = lambda n, sizes: min(b for b in sizes if b >= n)  # noqa: E731
    width = fit(max(new[s] for s in call), sampler.prefill_buckets)
    window = fit(max(lengths[s] + new[s] for s in call), sampler.prefill_window_buckets)
    rows = fit(len(call), sampler.prefill_row_buckets)
    if rows < 16:
        rows = fit(max(rows, 2, -(-64 // width)), sampler.prefill_row_buckets)
    return rows * width * window + sampler.prefill_call_cost


def test_prefill_calls_are_the_cheapest_split_by_width():
    """Against every split of the rows (sorted by length) into runs of whole width buckets, each
    run one call, enumerated: the chosen calls hold each row once and cost no more than the
    cheapest; rows that fill no bucket run in pieces of bucket size where that costs less; a
    sampler whose calls run on all slots makes one call."""
    sampler = Sampler(CONFIG, stop_ids=STOP, batch_size=16, max_len=2048, options=SamplerOptions(layout="per_layer"))
    rng = np.random.default_rng(1)
    for case in range(30):
        n = int(rng.integers(1, 9))
        slots = [int(s) for s in rng.choice(16, size=n, replace=False)]
        new = {s: int(rng.choice([3, 20, 40, 90, 300, 700])) for s in slots}
        lengths = rng.integers(0, 1000, size=16)
        calls = sampler.prefill_calls(new, lengths)
        assert sorted(s for call in calls for s in call) == sorted(slots)
        ordered = sorted(slots, key=lambda s: new[s])
        width = [min(b for b in sampler.prefill_buckets if b >= new[s]) for s in ordered]
        between = [i for i in range(1, n) if width[i] != width[i - 1]]  # rows of one width stay together
        cheapest = min(sum(_call_cost(sampler, new, lengths, ordered[a:b]) for a, b in zip((0,) + cuts, cuts + (n,)))
                       for k in range(len(between) + 1) for cuts in itertools.combinations(between, k))
        assert sum(_call_cost(sampler, new, lengths, call) for call in calls) <= cheapest, case
    # a long first prompt and short observations: two calls; rows of one width: one call
    lengths = np.full(16, 900)
    lengths[0] = 0
    assert sorted(map(sorted, sampler.prefill_calls({0: 700, 3: 40, 5: 50, 7: 60}, lengths))) == [[0], [3, 5, 7]]
    assert sampler.prefill_calls({s: 100 + s for s in range(16)}, lengths) == [list(range(16))]
    assert sorted(map(len, sampler.prefill_calls({s: 100 + s for s in range(12)}, lengths))) == [4, 8]  # not 16
    every = Sampler(CONFIG, stop_ids=STOP, batch_size=16, max_len=2048, options=SamplerOptions(layout="stacked"))
    assert every.prefill_row_buckets == (16,)
    assert every.prefill_calls({0: 700, 3: 40}, lengths) == [[0, 3]]
