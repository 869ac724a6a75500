"""A call that serves few slots runs on those rows alone (`SamplerOptions(row_buckets=...)`): the same
tokens, log-probs, logits and cache as the same call on every slot, bit for bit, and the other
slots untouched."""

import jax
import numpy as np
import pytest

from jaxscaffold.models import config as model_config, qwen3
from jaxscaffold.models.hf_io import EOS_IDS
from jaxscaffold.rollout.engine import Sampler, SamplerOptions
from jaxscaffold.rollout.sampling import SamplingConfig

CONFIG = model_config.tiny()


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

    def run(row_buckets):
        sampler = Sampler(CONFIG, stop_ids=EOS_IDS, batch_size=16, max_len=256,
                          options=SamplerOptions(layout=layout, sampling=SamplingConfig(temperature=1.0),
                                                 cache_dtype="float32", row_buckets=row_buckets))
        p = sampler.prepare(params)
        state = sampler.extend(p, sampler.init_state(), prompts)
        before = _arrays(state)
        state = sampler.extend(p, state, observations)  # 3 of 16 slots: a batch of 4 rows
        state, gens = sampler.generate(p, state, [14, 3, 9], max_new_tokens=[12, 20, 5], seeds=[1, 2, 3])
        state, more = sampler.generate(p, state, list(range(10)), max_new_tokens=6, seeds=list(range(10)))  # 10: 16
        return sampler, before, _arrays(state), gens, more

    sampler, before, alone, gens, more = run((4, 8, 16))
    _, _, every, gens_all, more_all = run((16,))
    assert sampler.row_buckets == (4, 8, 16)
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
    untouched = [10, 11, 12, 13, 15]
    for a, b in zip(alone[-3:-1], before[-3:-1]):
        np.testing.assert_array_equal(a[untouched], b[untouched])
    assert [int(alone[-2][s]) for s in untouched] == [len(prompts[s]) for s in untouched]


def test_row_buckets_default_and_checks():
    per_layer, stacked = SamplerOptions(layout="per_layer"), SamplerOptions(layout="stacked")
    assert Sampler(CONFIG, stop_ids=EOS_IDS, batch_size=64, max_len=128, options=per_layer).row_buckets == (8, 16, 32, 64)
    assert Sampler(CONFIG, stop_ids=EOS_IDS, batch_size=64, max_len=128, options=stacked).row_buckets == (64,)
    assert Sampler(CONFIG, stop_ids=EOS_IDS, batch_size=6, max_len=128, options=per_layer).row_buckets == (6,)
    with pytest.raises(ValueError, match="row_buckets"):
        Sampler(CONFIG, stop_ids=EOS_IDS, batch_size=16, max_len=128, options=SamplerOptions(row_buckets=(4, 8)))
