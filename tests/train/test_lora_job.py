"""LoRA through the whole job: the state and checkpoints hold the adapters alone, a run resumes
from them, and the export is the merged model in full (transformers reloads it with our logits)
plus a PEFT directory that `peft` loads onto the base with the same logits."""

import os

import jax
import numpy as np
import pytest
import torch

from jaxscaffold.models import hf_io, qwen3
from jaxscaffold.models.config import tiny
from jaxscaffold.models.word_tokenizer import padded_vocab_size
from jaxscaffold.train.export import export_checkpoint
from jaxscaffold.train.trainer import train
from jaxscaffold.train.vocabularies import word_tokenizer
from tests.models.hf_reference import hf_logits
from tests.train.configs import tiny_config


def _dir_bytes(path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _bf16_base(path, final_norm: float = 1.0, **overrides):
    """A tiny random base saved as bf16 (so the run's bf16 base and transformers' f32 reload
    hold the same values), its final norm's weight `final_norm`; `overrides` change the tiny
    config (e.g. its vocab_size)."""
    config = tiny(param_dtype="bfloat16", **overrides)
    params = qwen3.init_params(config, jax.random.key(0))
    hf_io.save_pretrained(str(path), config, dict(params, final_norm=params["final_norm"] * final_norm))
    return str(path)


@pytest.mark.slow
def test_lora_learns_the_letters_task(tmp_path):
    """Only the adapters train, and the letters reward rises well above a random policy's.

    On the rooms words (320 ids), not Qwen3's 151,936: over that vocabulary the adapters (which
    cannot touch the tied embedding) left a policy so flat that whether and when the reward rose
    depended on float rounding, i.e. on the CPU (it passed on an Intel Xeon, failed on an AMD
    EPYC). The prompt is mostly unknown words here, which does not matter: the reward is the
    share of the answer's letters that are 'e', and some rooms words are rich in it (" green"
    0.4; " the", " red", " one", " key" 0.333).

    The logits are the final norm's scale times a direction of the last hidden state against
    the fixed random embedding, so the base's final norm is scaled up (x8) to let the adapters
    make the policy sharp: at x4 the reward was still 0.14-0.19 at step 40, at x6 0.24-0.38;
    at x10 the policy settles within a few steps on what it first samples (0.14 to 0.40). GRPO
    ends on a plateau: a near-deterministic answer gives all advantages ~0, so it stays.

    Measured on an AMD EPYC (2 tasks x 8 rollouts a step): a uniform policy over the 320 ids
    (final norm zeroed) scores 0.102 +- 0.001 (2,560 episodes; a 5-step mean's standard
    deviation: 0.006). At x8, lr 2e-2, step 1 scores 0.02-0.09 (the init mostly repeats tokens)
    and the mean of steps 21-25 was 0.20-0.40 (median 0.33) over 20 runs: seeds 0-7 (the `seed`
    override) with XLA's test flags and with its default emitters, and 4 other base inits. The
    default emitters changed two runs' ends (seed 7: 0.342 for 0.395; seed 3: 0.243 for 0.299);
    seed 6 ended lowest (0.199 with either). So the bar sits halfway from random to the lowest
    plateau: 0.05 above one and below the other. Tried and no better: 4 tasks x 8 (seed 7:
    0.198), lr 3e-2 (once fell back to 0.09 at steps 21-25), lr 5e-3 or 1e-2 (plateaus at
    0.245-0.249 too), an entropy bonus of 0.01, sampling temperature 1.5, 4-token answers."""
    base = _bf16_base(tmp_path / "base", final_norm=8.0, vocab_size=padded_vocab_size(word_tokenizer("rooms")))
    cfg = tiny_config(tmp_path / "run", steps=25, **{
        "model.hf_path": base, "model.vocabulary": "rooms", "lora.rank": 8, "lora.base_dtype": "bfloat16",
        "rl.lr": 2e-2, "rollout.tasks_per_step": 2, "rollout.group_size": 8, "eval.every": 0, "checkpoint.every": 25})
    hist = train(cfg)["history"]
    reward = [h["rollout/reward"] for h in hist]
    first, last = reward[0], np.mean(reward[-5:])
    bar = 0.10 + 0.05  # the random policy's reward and a margin (see above)
    assert first < bar < last, reward  # starts unlearned, ends well above random


@pytest.mark.slow
def test_lora_run_checkpoints_adapters_resumes_and_exports_merged_and_peft(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    base_dir = _bf16_base(tmp_path / "base")
    lora = {"lora.rank": 4, "lora.alpha": 8.0, "lora.targets": "q,v,o,down", "lora.base_dtype": "bfloat16",
            "model.hf_path": base_dir, "rl.lr": 1e-2, "eval.every": 2, "checkpoint.every": 1}
    run = tmp_path / "run"
    out = train(tiny_config(run, steps=2, **lora))
    params = out["state"].params
    assert sorted(params) == ["down", "o", "q", "v"] and all(sorted(v) == ["a", "b"] for v in params.values())
    assert all(float(np.abs(np.asarray(v["b"])).max()) > 0 for v in params.values())  # trained
    # The checkpoint: adapters and their moments, not the 10M-parameter base (40 MB in f32).
    adapter_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    assert _dir_bytes(run / "checkpoints" / "2") < 4 * adapter_bytes + 1_000_000 < 20_000_000
    resumed = train(tiny_config(run, steps=3, **lora))["history"]
    assert [h["step"] for h in resumed] == [1, 2, 3] and "eval/success" in resumed[1]

    report = export_checkpoint(str(run), str(tmp_path / "hf"), peft_out=str(tmp_path / "peft"))
    assert report["step"] == 3 and report["max_abs_logit_diff"] < 1e-4
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    tokens = np.random.RandomState(0).randint(0, 1000, (2, 9))
    plain = hf_logits(base, tokens)
    with_peft = hf_logits(PeftModel.from_pretrained(base, str(tmp_path / "peft")).eval(), tokens)
    want = hf_logits(merged, tokens)
    assert np.abs(want - plain).max() > 1e-4  # the adapters changed the model
    assert np.abs(with_peft - want).max() / max(1.0, np.abs(want).max()) < 1e-5
    with pytest.raises(ValueError, match="PEFT adapter export needs a LoRA run"):
        full = tmp_path / "full"
        train(tiny_config(full, steps=1, **{"eval.every": 0, "checkpoint.every": 1}))
        export_checkpoint(str(full), str(tmp_path / "x"), peft_out=str(tmp_path / "y"))


def test_lora_with_the_trainer_recomputing_old_logprobs(tmp_path):
    """The recompute runs on the merged policy the sampler decoded with: in f32 the measured
    sampler/trainer mismatch is ~0 (on the adapters alone it would be the base's logits vs a
    random-adapter model: far from 0). On the word vocabulary: the merge and the recompute do
    not depend on Qwen3's."""
    cfg = tiny_config(tmp_path / "run", steps=1, words=True, **{"eval.every": 0, "checkpoint.every": 1, "lora.rank": 4,
                                                     "lora.alpha": 8.0, "lora.base_dtype": "float32",
                                                     "rl.recompute_old_logprobs": True})
    last = train(cfg)["history"][-1]
    assert abs(last["train/mismatch_kl"]) < 1e-6 and abs(last["train/mismatch_ratio_max"] - 1) < 1e-4, last
