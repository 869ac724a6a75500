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
