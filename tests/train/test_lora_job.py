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
from jaxscaffold.train.export import export_checkpoint
from jaxscaffold.train.trainer import train
from tests.models.hf_reference import hf_logits
from tests.train.configs import tiny_config


def _dir_bytes(path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _bf16_base(path, final_norm: float = 1.0):
    """A tiny random base saved as bf16 (so the run's bf16 base and transformers' f32 reload
    hold the same values), its final norm's weight `final_norm`."""
    config = tiny(param_dtype="bfloat16")
    params = qwen3.init_params(config, jax.random.key(0))
    hf_io.save_pretrained(str(path), config, dict(params, final_norm=params["final_norm"] * final_norm))
    return str(path)


@pytest.mark.slow
def test_lora_learns_the_letters_task(tmp_path):
    """Only the adapters train, and the letters reward rises (a random policy scores ~0.12).
    The base's final norm is scaled up (x18): the adapters cannot touch the (tied) embedding, so
    the logits are the final norm's scale times a direction of the last hidden state against a
    random 151,936 x 64 embedding. Once an update moves that direction off the input token's
    (the init mostly repeats tokens), the policy is near random, with an entropy of about
    ln(V) - (0.16 x scale)^2 / 2: 10.1 at x12, 8.7 at x16, 7 at x18. At x12 the policy is too
    flat to learn from reliably: the rise waits for a chance concentration on some e-rich token,
    so when it comes depends on float rounding (the CPU's instruction set): it came at step 32
    on an AMD Zen, on an Intel Xeon not in 50 steps at lr 3e-2 (0.09-0.14 throughout, entropy
    ~10), and at lr 1e-2 it reached 0.26 at step 37 and fell back at 38. x18 is sharper: the
    reward rises steadily to a deterministic policy scoring 0.333 (a word a third e: all
    advantages 0, so it stays). x20 starts deterministic with reward 0 (6 steps: nothing to learn).
    Measured on an Intel Xeon ("Intel(R) Xeon(R) Processor", XLA's test flags, 2 tasks x 8
    rollouts a step): at x18, lr 2e-2, the reward is 0.013 at step 1 (the init repeats tokens),
    0.10-0.20 to step 12, 0.15-0.23 at steps 13-18 and 0.30-0.333 from step 19 on (entropy 0.1
    by step 24, 0.028 at 50). Neighbours: x18 at lr 3e-2 learned faster (0.40 from step 7 to 37, a
    mean of 0.24 over the first 10 steps: hence the start is judged by step 1 and the end
    against the random policy's 0.12, not against the first 10 steps); x16 at lr 3e-2 rose at
    steps 31-35 to 0.333; x16 at lr 2e-2 only crept to 0.20 by step 50 (too slow)."""
    cfg = tiny_config(tmp_path / "run", steps=50, **{
        "model.hf_path": _bf16_base(tmp_path / "base", final_norm=18.0), "lora.rank": 8,
        "lora.base_dtype": "bfloat16", "rl.lr": 2e-2, "rollout.tasks_per_step": 2, "rollout.group_size": 8,
        "eval.every": 0, "checkpoint.every": 50})
    hist = train(cfg)["history"]
    reward = [h["rollout/reward"] for h in hist]
    first, last = reward[0], np.mean(reward[-5:])
    assert first < 0.2 and last > 0.12 + 0.1, reward  # starts unlearned, ends well above random


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
