"""Embedding throughput: our JAX Qwen3-Embedding (last-token pooling, bucketed, jitted) vs
transformers' `Qwen3Model` (PyTorch CPU) with the model card's recipe, same weights and texts;
plus the offline MiniLM embedder the world-model reward uses on CPU."""

from __future__ import annotations

import tempfile

import numpy as np

from benchmarks.common import REPORT, median_time
from jaxscaffold.models.embedding import Qwen3Embedder
from jaxscaffold.models.tokenizer import QwenOfflineTokenizer, write_hf_tokenizer

CONFIGS = {  # Qwen3-Embedding-0.6B's shape, shallower (CPU), and a tiny one
    "tiny": dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=32, intermediate_size=384),
    "0.6b-4layers": dict(num_hidden_layers=4, hidden_size=1024, num_attention_heads=16, num_key_value_heads=8,
                         head_dim=128, intermediate_size=3072),
}
VOCAB = 151680  # covers the Qwen3 tokenizer's ids


def _texts(n: int) -> list[str]:
    rng = np.random.default_rng(0)
    objects = ["apple", "mug", "knife", "pencil", "vase", "towel", "plate", "keychain"]
    out = []
    for i in range(n):
        items = ", ".join(f"a {objects[j]} {rng.integers(1, 5)}" for j in rng.permutation(8)[: rng.integers(1, 8)])
        out.append(f"You arrive at countertop {i % 5 + 1}. On the countertop {i % 5 + 1}, you see {items}.")
    return out


def _hf(name: str, directory: str):
    import torch
    from transformers import Qwen3Config, Qwen3Model
    torch.manual_seed(0)
    model = Qwen3Model(Qwen3Config(**CONFIGS[name], vocab_size=VOCAB, max_position_embeddings=4096)).eval()
    model.save_pretrained(directory)
    write_hf_tokenizer(directory)
    return model


def _torch_embed(model, rows: list[list[int]], batch: int) -> np.ndarray:
    import torch
    out = []
    for s in range(0, len(rows), batch):
        chunk = rows[s:s + batch]
        n = max(map(len, chunk))
        ids = np.zeros((len(chunk), n), np.int64)
        mask = np.zeros((len(chunk), n), np.int64)
        for i, r in enumerate(chunk):  # left padding: the last position is every row's last token
            ids[i, n - len(r):], mask[i, n - len(r):] = r, 1
        with torch.no_grad():
            h = model(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask)).last_hidden_state[:, -1]
            out.append(torch.nn.functional.normalize(h, p=2, dim=1).numpy())
    return np.concatenate(out)


def run(quick: bool = False) -> None:
    import torch
    torch.set_num_threads(max(1, torch.get_num_threads()))
    n, batch, reps = (64, 16, 2) if quick else (256, 32, 3)
    texts = _texts(n)
    tok = QwenOfflineTokenizer()
    eos = tok.token_id("<|endoftext|>")
    rows = [tok.encode(t) + [eos] for t in texts]
    REPORT.say(f"{n} texts of {min(map(len, rows))}-{max(map(len, rows))} tokens, batch {batch}, f32, CPU")
    for name in (["tiny"] if quick else list(CONFIGS)):
        with tempfile.TemporaryDirectory() as d:
            model = _hf(name, d)
            ours = Qwen3Embedder.from_pretrained(d, batch_size=batch, min_bucket=32)
            np.testing.assert_allclose(ours(texts[:batch]), _torch_embed(model, rows[:batch], batch), atol=1e-4)
            t_ours = median_time(lambda: ours(texts), reps=reps)
            t_ref = median_time(lambda: _torch_embed(model, rows, batch), reps=reps)
            REPORT.figure(f"embed {name}: jax Qwen3Embedder", n / t_ours, "emb/s", ratio=t_ref / t_ours)
            REPORT.figure(f"embed {name}: transformers Qwen3Model", n / t_ref, "emb/s")
    try:
        from jaxscaffold.worldmodel.embedders import make_embedder
        minilm = make_embedder("minilm", batch_size=batch)
    except ImportError as e:
        REPORT.say(f"minilm skipped: {e}")
        return
    t = median_time(lambda: minilm(texts), reps=reps)
    REPORT.figure("embed minilm (sentence-transformers, the offline reward)", n / t, "emb/s")
