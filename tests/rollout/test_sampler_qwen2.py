"""The sampler on a Qwen2.5-architecture model (q/k/v biases, no q/k norms), against the model's
own full forward: greedy tokens in both decode layouts, and logprobs at temperature 1."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxscaffold.models import hf_io, qwen3
from jaxscaffold.rollout.engine import Sampler
from jaxscaffold.rollout.sampling import GREEDY, SamplingConfig
from tests.models.hf_reference import make_hf_model
from tests.rollout.test_sampler import LAYOUTS, teacher_forced_logprobs

VOCAB = 320
full_forward = jax.jit(qwen3.forward, static_argnums=1)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2-ckpt")
    make_hf_model(vocab=VOCAB, hidden=64, inter=128, heads=4, kv_heads=2, head_dim=16, std=0.3,
                  model_type="qwen2").save_pretrained(path)
    config, params = hf_io.load_pretrained(str(path))
    assert config.qkv_bias and not config.qk_norm
    return config, params


@pytest.mark.parametrize("layout", LAYOUTS)
def test_greedy_equals_repeated_argmax_of_full_forward(model, layout):
    config, params = model
    sampler = Sampler(config, batch_size=3, max_len=64, sampling=GREEDY, stop_ids=(), cache_dtype="float32",
                      layout=layout)
    prepared = sampler.prepare(params)
    rng = np.random.RandomState(0)
    prompts = {s: list(rng.randint(0, VOCAB, n)) for s, n in enumerate([9, 1, 5])}
    state = sampler.extend(prepared, sampler.init_state(), prompts)
    _, out = sampler.generate(prepared, state, list(prompts), max_new_tokens=10, seeds=[0, 1, 2])
    width = 32  # every sequence right-padded to one length: one compiled forward (causal, so padding after
    for slot, prompt in prompts.items():  # the last real token changes none of its logits)
        seq = list(prompt)
        for _ in range(10):
            tokens = np.zeros((1, width), np.int32)
            tokens[0, :len(seq)] = seq
            segments = (np.arange(width) < len(seq)).astype(np.int32)[None]
            logits = full_forward(params, config, jnp.asarray(tokens), segment_ids_BT=jnp.asarray(segments))
            seq.append(int(jnp.argmax(logits[0, len(seq) - 1])))
        assert list(out[slot].tokens) == seq[len(prompt):], slot


def test_logprobs_equal_teacher_forcing(model):
    config, params = model
    sampler = Sampler(config, batch_size=2, max_len=64, sampling=SamplingConfig(temperature=1.0),
                      stop_ids=(), cache_dtype="float32")
    prompts = {0: [5, 6, 7, 8], 1: [9] * 11}
    state = sampler.extend(sampler.prepare(params), sampler.init_state(), prompts)
    _, out = sampler.generate(sampler.prepare(params), state, [0, 1], max_new_tokens=16, seeds=[3, 4])
    for slot, prompt in prompts.items():
        ref = teacher_forced_logprobs(params, config, prompt + list(out[slot].tokens))[len(prompt) - 1:]
        np.testing.assert_allclose(out[slot].logprobs, ref, atol=1e-4)
