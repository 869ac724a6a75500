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
    The base's final norm is scaled up (x12): the adapters cannot touch the (tied) embedding,
    and at the random init's norm no direction of the last hidden state moves the logits of a
    151,936-token vocabulary enough to favour a few tokens (measured at lr 0.1: no rise in 30
    steps); x12 leaves the initial policy random (entropy ~5) but learnable (x25 makes it
    deterministic: entropy 0.003, reward 0, nothing to learn from). Measured with
    these settings (XLA's test flags, 2 tasks x 8 rollouts a step, 50 steps): reward ~0.10-0.15
    for 30 steps, then 0.22 at step 32 and 0.45-0.50 from step 38 on (at lr 5e-2 it rose to 0.40
    by step 23, fell back to 0.11 and rose again: unstable). 4 tasks a step learn alike at twice
    the cost."""
    cfg = tiny_config(tmp_path / "run", steps=50, **{
        "model.hf_path": _bf16_base(tmp_path / "base", final_norm=12.0), "lora.rank": 8,
        "lora.base_dtype": "bfloat16", "rl.lr": 3e-2, "rollout.tasks_per_step": 2, "rollout.group_size": 8,
        "eval.every": 0, "checkpoint.every": 50})
    hist = train(cfg)["history"]
    reward = [h["rollout/reward"] for h in hist]
    first, last = np.mean(reward[:10]), np.mean(reward[-5:])
    assert first < 0.2 and last > first + 0.1, reward


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
    random-adapter model: far from 0)."""
    cfg = tiny_config(tmp_path / "run", steps=1, **{"eval.every": 0, "checkpoint.every": 1, "lora.rank": 4,
                                                     "lora.alpha": 8.0, "lora.base_dtype": "float32",
                                                     "rl.recompute_old_logprobs": True})
    last = train(cfg)["history"][-1]
    assert abs(last["train/mismatch_kl"]) < 1e-6 and abs(last["train/mismatch_ratio_max"] - 1) < 1e-4, last
