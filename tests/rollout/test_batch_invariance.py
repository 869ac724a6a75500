"""A row samples bitwise the same whatever batch (and slot) it is decoded in: what splitting a
step's episodes over hosts relies on (tests/train/test_multihost.py)."""

import jax
import numpy as np
import pytest

from jaxscaffold.models import config as model_config, qwen3
from jaxscaffold.models.hf_io import EOS_IDS
from jaxscaffold.rollout.engine import Sampler, SamplerOptions
from jaxscaffold.rollout.sampling import SamplingConfig

CONFIG = model_config.tiny()  # the real 151936-token vocabulary: a random model's distribution is nearly flat


@pytest.mark.default_emitters
def test_rows_decode_bitwise_alike_at_batch_2_to_16():
    """Two rows decoded among other rows at batch 2, 4, 8 and 16, in different slots: equal
    tokens, log-probs and next-token logits, bit for bit. At T = 1 over a nearly flat
    vocabulary a last-bit difference in the logits picks the neighbouring token within a few
    steps (the multi-host loop test at step 2). XLA's default emitters, as a run compiles them."""
    params = qwen3.init_params(CONFIG, jax.random.key(0))
    rng = np.random.default_rng(0)
    rows = [list(rng.integers(0, 1000, size=n)) for n in (40, 25)]
    fillers = [list(rng.integers(0, 1000, size=n)) for n in rng.integers(10, 60, size=14)]

    def run(batch, slots):
        sampler = Sampler(CONFIG, stop_ids=EOS_IDS, batch_size=batch, max_len=256,
                          options=SamplerOptions(sampling=SamplingConfig(temperature=1.0), cache_dtype="float32"))
        others = [s for s in range(batch) if s not in slots]
        prompts = {**dict(zip(slots, rows)), **dict(zip(others, fillers))}
        seeds = {**dict(zip(slots, (7, 8))), **{s: 100 + s for s in others}}
        p = sampler.prepare(params)
        state = sampler.extend(p, sampler.init_state(), prompts)
        state, gens = sampler.generate(p, state, list(range(batch)), max_new_tokens=12,
                                       seeds=[seeds[s] for s in range(batch)])
        logits = np.asarray(state.logits_BV)
        return [(gens[s].tokens, gens[s].logprobs, gens[s].sampling_logprobs, logits[s]) for s in slots]

    want = run(2, (0, 1))
    for batch, slots in ((4, (2, 3)), (8, (5, 6)), (16, (14, 9))):
        for row, (got, ref) in enumerate(zip(run(batch, slots), want)):
            for name, a, b in zip(("tokens", "logprobs", "sampling_logprobs", "logits"), got, ref):
                np.testing.assert_array_equal(a, b, err_msg=f"row {row} at batch {batch}: {name}")
