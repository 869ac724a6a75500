"""The episode driver with the model agent: what the model is shown, and single-turn completions."""

import jax
import numpy as np
import pytest

from jaxscaffold.envs import registry
from jaxscaffold.models import config as model_config, qwen3
from jaxscaffold.models.chat import Qwen3ChatRenderer
from jaxscaffold.models.tokenizer import QwenOfflineTokenizer
from jaxscaffold.rollout.engine import Sampler, SamplerOptions
from jaxscaffold.rollout.sampling import SamplingConfig
from jaxscaffold.envs.local import LocalEnvs
from jaxscaffold.episodes.agents import ModelAgent, RolloutConfig
from jaxscaffold.episodes.driver import complete, run_episodes
from tests.train.configs import word_model

CONFIG = model_config.tiny()
# Where only token ids and seeds matter (reproducible and split rows), the tiny model on the rooms
# word vocabulary (~270 ids, not Qwen3's 151,936); where decoded text is checked, Qwen's.
WORDS, WORDS_CONFIG = word_model()


@pytest.fixture(scope="module")
def params():
    return qwen3.init_params(CONFIG, jax.random.key(0))


@pytest.fixture(scope="module")
def word_params():
    return qwen3.init_params(WORDS_CONFIG, jax.random.key(0))


def test_the_env_system_prompt_reaches_the_model(params):
    """BFCL's per-entry function docs are in the system prompt the model reads."""
    pytest.importorskip("bfcl_eval")
    tok = QwenOfflineTokenizer()
    task = registry.catalogue("bfcl", "train")[0]
    envs = LocalEnvs({"bfcl": registry.factory("bfcl")})
    first = envs.reset([task])[0]
    envs.close()
    tools = [t["function"]["name"] if "function" in t else t["name"] for t in first.privileged["tools"]]
    sampler = Sampler(CONFIG, stop_ids=tok.eos_ids, batch_size=1, max_len=4608,
                      options=SamplerOptions(sampling=SamplingConfig()))
    agent = ModelAgent(params, sampler, tok, RolloutConfig(max_new_tokens=4), seed=0, train_step=1)
    ep = run_episodes(agent, envs, [task], [0], max_turns=1)[0]
    shown = tok.decode(ep.conversation.ids)
    assert first.system_prompt in shown
    assert all(name in shown for name in tools)
    assert ep.observations[0] == first.text


def _prompts(tok, n):
    chat = Qwen3ChatRenderer(tok)
    return [chat.render([{"role": "user", "content": f"question {i}"}], add_generation_prompt=True,
                        enable_thinking=False) for i in range(n)]


def test_complete_is_reproducible_per_row(word_params):
    params, tok = word_params, WORDS
    prompts = _prompts(tok, 5)
    sampler = Sampler(WORDS_CONFIG, stop_ids=tok.eos_ids, batch_size=2, max_len=64,
                      options=SamplerOptions(sampling=SamplingConfig(temperature=1.0)))
    a = complete(params, sampler, tok, prompts, max_new_tokens=6, seed=3)
    b = complete(params, sampler, tok, prompts, max_new_tokens=6, seed=3)
    assert [c.ids for c, _ in a] == [c.ids for c, _ in b]
    for (conv, text), p in zip(a, prompts):
        assert conv.ids[:len(p)] == p and sum(conv.assistant_mask) == len(conv.ids) - len(p)
        gen = [t for t in conv.ids[len(p):] if t not in tok.eos_ids]
        assert text == tok.decode(gen)
    with pytest.raises(ValueError, match="does not fit"):
        complete(params, sampler, tok, [list(range(100))], max_new_tokens=1, seed=0)


def test_a_prompt_that_does_not_fit_is_a_reported_failure(params):
    tok = QwenOfflineTokenizer()
    envs = LocalEnvs({"letters": registry.factory("letters")})
    tasks = registry.catalogue("letters", "train")[:2]
    sampler = Sampler(CONFIG, stop_ids=tok.eos_ids, batch_size=2, max_len=32,
                      options=SamplerOptions(sampling=SamplingConfig()))
    agent = ModelAgent(params, sampler, tok, RolloutConfig(max_new_tokens=30), seed=0, train_step=1)
    eps = run_episodes(agent, envs, tasks, [0, 1], max_turns=1)
    assert all(e.failure and e.failure.startswith("context:") for e in eps)


def test_stepwise_rows_rebuild_the_prompt_with_a_history_window(params, monkeypatch):
    """The reference code's representation: one row per model turn whose prompt is the task,
    the step count, the last `history_window` steps and the current observation."""
    from tests.train.toy_envs import CoinEnv, catalogue, register
    register(monkeypatch)
    tok = QwenOfflineTokenizer()
    tasks = catalogue("train", 6)
    sampler = Sampler(CONFIG, stop_ids=tok.eos_ids, batch_size=6, max_len=512,
                      options=SamplerOptions(sampling=SamplingConfig()))
    cfg = RolloutConfig(max_turns=3, max_new_tokens=6, representation="stepwise", history_window=1)
    eps = run_episodes(ModelAgent(params, sampler, tok, cfg, seed=0, train_step=1), LocalEnvs({"coin": CoinEnv}),
                       tasks, list(range(6)), max_turns=cfg.max_turns)
    assert any(e.steps >= 2 for e in eps)
    for e in eps:
        rows = e.training_rows()
        assert len(rows) == e.steps  # one row per model turn (each got an env answer here)
        for t, row in enumerate(rows):
            text = tok.decode(row.ids)
            assert text.count("<|im_start|>user") == 1  # a fresh prompt, not a growing chat
            if t == 0:
                assert e.observations[0] in text and "step(s) so far" not in text
            else:
                assert f"You have taken {t} step(s) so far." in text
                assert f"Current observation (step {t + 1}):\n{e.observations[t]}" in text
                assert f"[Step {t}] your action: {e.actions[t - 1]}" in text
                if t >= 2:  # the window holds one step: the older ones are gone
                    assert f"[Step {t - 1}] your action" not in text
            mask = row.assistant_mask
            assert sum(mask) > 0 and mask[-sum(mask):] == [1] * sum(mask)  # the response ends the row
    agent = ModelAgent(params, sampler, tok, RolloutConfig(max_new_tokens=6), seed=0, train_step=1)
    traj = run_episodes(agent, LocalEnvs({"coin": CoinEnv}), tasks, list(range(6)), max_turns=3)
    assert all(len(e.training_rows()) == 1 for e in traj)


def test_complete_rows_keep_their_seeds_when_split(word_params):
    """A share of the rows (first_row = its offset) samples exactly those rows of the whole."""
    params, tok = word_params, WORDS
    prompts = _prompts(tok, 4)
    sampler = Sampler(WORDS_CONFIG, stop_ids=tok.eos_ids, batch_size=4, max_len=64,
                      options=SamplerOptions(sampling=SamplingConfig(temperature=1.0)))
    whole = complete(params, sampler, tok, prompts, max_new_tokens=6, seed=5)
    tail = complete(params, sampler, tok, prompts[2:], max_new_tokens=6, seed=5, first_row=2)
    assert [c.ids for c, _ in tail] == [c.ids for c, _ in whole[2:]]


@pytest.mark.default_emitters
def test_episodes_keep_their_samples_when_split_by_episode_ids(word_params, monkeypatch):
    """What multi-host rollouts rely on: episodes run in two calls (each passing the global
    episode ids of its share, at its own batch size) sample exactly what one call samples,
    turn after turn; other episode ids sample differently."""
    from tests.train.toy_envs import CoinEnv, catalogue, register
    register(monkeypatch)
    params, tok = word_params, WORDS
    tasks = catalogue("train", 3)
    tasks = [t for t in tasks for _ in range(2)]  # groups of two: same task, different samples
    groups = [0, 0, 1, 1, 2, 2]
    cfg = RolloutConfig(max_turns=3, max_new_tokens=6)

    def run(idx, ids):
        sampler = Sampler(WORDS_CONFIG, stop_ids=tok.eos_ids, batch_size=len(idx), max_len=512,
                          options=SamplerOptions(sampling=SamplingConfig(1.0)))
        agent = ModelAgent(params, sampler, tok, cfg, seed=3, train_step=1, episode_ids=ids)
        return run_episodes(agent, LocalEnvs({"coin": CoinEnv}), [tasks[i] for i in idx], [groups[i] for i in idx],
                            max_turns=cfg.max_turns)

    whole = run(range(6), list(range(6)))
    split = run(range(2), [0, 1]) + run(range(2, 6), [2, 3, 4, 5])
    assert len({tuple(e.conversation.ids) for e in whole}) == 6  # the samples differ between rows
    for a, b in zip(whole, split):
        assert a.conversation.ids == b.conversation.ids and a.actions == b.actions and a.reward == b.reward
    shifted = run(range(2, 6), [6, 7, 8, 9])
    assert [e.conversation.ids for e in shifted] != [e.conversation.ids for e in whole[2:]]
