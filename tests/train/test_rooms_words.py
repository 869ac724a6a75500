"""configs/rooms.py's from-scratch model on the rooms word vocabulary trains through the
launcher's path (`train.trainer.train` of the checked config), with an embedding sized to the
vocabulary rather than Qwen3's 151,936 rows; its HF export carries the rooms words as its
tokenizer (transformers encodes the env's texts to the run's ids), not Qwen's."""

import os

import numpy as np

from jaxscaffold import config as config_lib
from jaxscaffold.train.trainer import train
from jaxscaffold.train.vocabularies import word_tokenizer
from tests.train.configs import load_config


def test_rooms_word_model_trains_a_step(tmp_path):
    cfg = load_config("rooms", **{"out_dir": str(tmp_path), "steps": 1, "rollout.tasks_per_step": 1,
                                  "rollout.group_size": 2, "rollout.max_turns": 2, "rollout.max_len": 512,
                                  "eval.every": 0, "mesh.devices": 1, "export.at_end": True,
                                  "export.verify": True})
    out = train(config_lib.from_configdict(cfg))
    embed = [x for x in np.asarray(out["state"].params["embed"]).shape]
    words = word_tokenizer("rooms").vocab_size  # 267: the embedding is its size rounded up to 64 rows
    assert embed[1] == 64 and embed[0] % 64 == 0 and words <= embed[0] < words + 64 and embed[0] < 151936
    (h,) = out["history"]
    assert h["step"] == 1 and h["train/tokens"] > 0
    assert all(np.isfinite(h[k]) for k in ("train/entropy", "rollout/reward"))
    assert out["export"]["max_abs_logit_diff"] < 1e-4
    from transformers import AutoTokenizer

    from jaxscaffold.envs import rooms

    hf = AutoTokenizer.from_pretrained(os.path.join(tmp_path, "hf"))
    words = word_tokenizer("rooms")
    assert len(hf) == words.vocab_size
    for text in rooms.vocabulary_texts()[:50] + ("Look around: a zorb?\n",):
        ids = hf.encode(text, add_special_tokens=False)
        assert ids == words.encode(text), text
        assert hf.decode(ids) == words.decode(ids)
    assert hf.convert_tokens_to_ids("<|im_end|>") == words.special_ids["<|im_end|>"]
    from transformers import GenerationConfig  # HF generate stops at the words' own end ids

    assert GenerationConfig.from_pretrained(os.path.join(tmp_path, "hf")).eos_token_id == list(words.eos_ids)


def test_a_turn_ends_at_the_vocabularys_own_end_token():
    """The job's samplers stop at the run's tokenizer's end ids (the word vocabulary's
    <|endoftext|> is id 0, its <|im_end|> id 2), not at Qwen3's 151,643 / 151,645: with Qwen3's,
    every rooms turn ran to max_new_tokens past its <|im_end|>. With the LM head zeroed all logits
    tie and greedy decoding takes id 0, so a stopping turn is exactly that one token."""
    import jax

    from jaxscaffold.episodes.driver import complete
    from jaxscaffold.models.chat import Qwen3ChatRenderer
    from jaxscaffold.train.job import build_job

    cfg = config_lib.from_configdict(load_config("rooms", **{"mesh.devices": 1, "rollout.max_len": 512}))
    job, state = build_job(cfg)
    words = word_tokenizer("rooms")
    assert job.tokenizer.eos_ids == words.eos_ids and set(words.eos_ids) == {0, 2}
    for sampler in (job.sampler, job.eval_sampler):
        assert sorted(sampler.stop_ids.tolist()) == sorted(words.eos_ids)
    head = "lm_head" if "lm_head" in state.params else "embed"
    params = {**state.params, head: jax.numpy.zeros_like(state.params[head])}
    prompt = Qwen3ChatRenderer(words).render([{"role": "user", "content": "look"}], add_generation_prompt=True,
                                             enable_thinking=False)
    (conv, text), = complete(params, job.eval_sampler, words, [prompt], max_new_tokens=8, seed=0)
    assert conv.ids[len(prompt):] == [0] and text == ""
