"""Tiny random transformers Qwen3 (and Qwen2) models: the independent reference for parity tests."""

from __future__ import annotations

import numpy as np
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Model, Qwen3Config, Qwen3ForCausalLM, Qwen3Model


def make_hf_model(*, vocab=320, hidden=64, inter=96, layers=2, heads=4, kv_heads=2, head_dim=16,
                  tied=False, embedding=False, seed=0, std=0.2, dtype=torch.float32, model_type="qwen3"):
    """A random transformers Qwen3ForCausalLM (or Qwen3Model) in eval mode; model_type="qwen2":
    Qwen2ForCausalLM / Qwen2Model (q/k/v biases, no q/k norms; head_dim is hidden / heads).

    Weights are drawn with a larger std than the default init so logits are far from
    uniform and a wrong formula cannot hide inside tiny numbers.
    """
    torch.manual_seed(seed)
    shared = dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, tie_word_embeddings=tied,
        max_position_embeddings=512,
    )
    if model_type == "qwen2":
        assert head_dim * heads == hidden, "Qwen2Config has no head_dim: it is hidden / heads"
        cfg = Qwen2Config(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **shared)
        model = (Qwen2Model if embedding else Qwen2ForCausalLM)(cfg)
    else:
        cfg = Qwen3Config(head_dim=head_dim, rope_theta=10000.0, **shared)
        model = (Qwen3Model if embedding else Qwen3ForCausalLM)(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, std)
    return model.to(dtype).eval()


def hf_logits(model, tokens, attention_mask=None, position_ids=None) -> np.ndarray:
    with torch.no_grad():
        out = model(
            input_ids=torch.as_tensor(np.asarray(tokens)),
            attention_mask=None if attention_mask is None else torch.as_tensor(np.asarray(attention_mask)),
            position_ids=None if position_ids is None else torch.as_tensor(np.asarray(position_ids)),
        )
    return out.logits.float().numpy()
