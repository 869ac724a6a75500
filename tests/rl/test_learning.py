"""GRPO end to end on CPU: sampler + advantages + loss + AdamW learn a verifiable task.

Task: the prompt names a target token; the policy must repeat it. Reward = the fraction of
the response tokens equal to the target (chance: 1/vocab)."""

import jax
import numpy as np
import pytest

from jaxscaffold.models import qwen3
from jaxscaffold.models.config import Qwen3Config
from jaxscaffold.rl.advantages import advantages
from jaxscaffold.rl.presets import preset
from jaxscaffold.rl.train_step import OptimizerConfig, init_train_state, make_train_step
from jaxscaffold.rollout.engine import Sampler, SamplerOptions
from jaxscaffold.rollout.sampling import SamplingConfig

LR, STEPS = 3e-3, 250
VOCAB, TARGETS, PROMPTS, GROUP, RESPONSE = 32, list(range(2, 10)), 8, 8, 3


@pytest.mark.parametrize("algo", ["grpo"])
def test_grpo_learns_to_repeat_the_named_token(algo):
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=8)
    rows = PROMPTS * GROUP
    sampler = Sampler(config, batch_size=rows, max_len=8, stop_ids=(),
                      options=SamplerOptions(sampling=SamplingConfig(temperature=1.0), cache_dtype="float32",
                                             prefill_buckets=(2, 7), decode_buckets=(RESPONSE,)))
    opt = OptimizerConfig(lr=LR).make()
    step = make_train_step(config, preset(algo), opt)
    state = init_train_state(qwen3.init_params(config, jax.random.key(0)), opt)
    rng = np.random.RandomState(0)
    history = []
    for it in range(STEPS):
        targets = np.repeat(rng.choice(TARGETS, PROMPTS), GROUP)
        prompts = {r: [1, int(targets[r])] for r in range(rows)}
        cache = sampler.extend(state.params, sampler.init_state(), prompts, lengths=np.zeros(rows, np.int32))
        _, gens = sampler.generate(state.params, cache, list(range(rows)), max_new_tokens=RESPONSE,
                                   seeds=[it * rows + r for r in range(rows)], lengths=np.full(rows, 2, np.int32))
        resp = np.stack([gens[r].tokens for r in range(rows)])
        reward = (resp == targets[:, None]).mean(1)
        history.append(reward.mean())
        adv = advantages(reward, np.repeat(np.arange(PROMPTS), GROUP), preset("grpo"))
        tokens = np.concatenate([np.stack([prompts[r] for r in range(rows)]), resp], 1).astype(np.int32)
        old = np.zeros(tokens.shape, np.float32)
        old[:, 2:] = np.stack([gens[r].logprobs for r in range(rows)])
        mask = np.zeros(tokens.shape, np.int32)
        mask[:, 2:] = 1
        batch = {"tokens_BT": tokens, "segment_ids_BT": np.ones_like(tokens), "loss_mask_BT": mask,
                 "old_logp_BT": old, "adv_B": adv.astype(np.float32)}
        state, metrics = step(state, batch)
        # On-policy, one mini-batch: the sampler's logprobs are the trainer's (ratio 1).
        assert abs(float(metrics["ratio_mean"]) - 1.0) < 1e-3
        if it >= 10 and np.mean(history[-5:]) >= 0.95:
            break
    print(f"\n[learning] {algo}: reward {history[0]:.2f} -> {np.mean(history[-5:]):.2f} in {len(history)} steps")
    assert history[0] < 0.2  # near chance (1/32 per token)
    assert np.mean(history[-5:]) >= 0.9
