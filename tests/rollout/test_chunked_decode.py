"""`MultiTurn.decode`: a turn decoded a few tokens at a time, rows joining and leaving between
chunks, is the turn one `generate` call samples (tokens, logprobs, finish reasons, cache)."""

import jax
import numpy as np

from jaxscaffold.models import config as model_config, qwen3
from jaxscaffold.rollout.conversation import MultiTurn
from jaxscaffold.rollout.engine import Sampler, SamplerOptions
from jaxscaffold.rollout.sampling import SamplingConfig

CONFIG = model_config.tiny(vocab_size=512)  # token ids only: a small vocabulary keeps the LM head cheap
STOP = (11,)  # the random tiny model samples it at the 13th and 17th token of two turns, which end early


def test_chunks_give_the_turn_of_one_generate_call():
    params = qwen3.init_params(CONFIG, jax.random.key(1))
    sampler = Sampler(CONFIG, batch_size=3, max_len=128, stop_ids=STOP,
                      options=SamplerOptions(sampling=SamplingConfig(temperature=1.0)))
    prompts = {0: [1, 2, 3, 4], 1: [5, 6], 2: [9, 10, 11]}
    whole = MultiTurn(sampler)
    whole.extend(params, prompts)
    ref = whole.generate(params, [0, 1, 2], max_new_tokens=20, seeds=[11, 12, 13])

    chunked = MultiTurn(sampler)
    chunked.extend(params, {0: prompts[0], 1: prompts[1]})  # slot 2 joins after the first chunk
    ended = chunked.decode(params, {0: (20, 11), 1: (20, 12)}, chunk=3)
    chunked.extend(params, {2: prompts[2]})
    turns = {0: (20, 11), 1: (20, 12), 2: (20, 13)}
    while len(ended) < 3:
        ended.update(chunked.decode(params, {s: t for s, t in turns.items() if s not in ended}, chunk=3))
    for s in range(3):
        np.testing.assert_array_equal(ended[s].tokens, ref[s].tokens)
        np.testing.assert_allclose(ended[s].logprobs, ref[s].logprobs, rtol=0, atol=1e-6)
        assert ended[s].finish_reason == ref[s].finish_reason
        assert chunked.conversations[s].ids == whole.conversations[s].ids
        assert chunked.conversations[s].finish_reasons == [ref[s].finish_reason]
    assert sorted(g.finish_reason for g in ref.values()) == ["length", "stop", "stop"]  # both ways of ending
    np.testing.assert_array_equal(sampler.lengths(chunked.state), sampler.lengths(whole.state))
