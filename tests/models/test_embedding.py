"""Qwen3-Embedding on our port equals transformers' Qwen3Model with the model card's recipe
(left padding, the last position's hidden state, L2 normalised), sharded or not."""

import numpy as np
import pytest
import torch

from jaxscaffold.models import embedding, sharding
from jaxscaffold.models.tokenizer import QwenOfflineTokenizer, write_hf_tokenizer
from tests.models.hf_reference import make_hf_model

TEXTS = [
    "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a desk 2.",
    "You open the drawer 1. The drawer 1 is open. In it, you see a pencil 3.",
    "Nothing happens.",
    "You pick up the mug 1 from the countertop 2.",
    "On the shelf 4, you see a vase 2, a keychain 1, and a creditcard 3. " * 3,
]


@pytest.fixture(scope="module")
def hf_embedder(tmp_path_factory):
    # A vocabulary that covers the Qwen3 tokenizer's ids, so real text can be embedded.
    model = make_hf_model(embedding=True, vocab=151680, heads=4, kv_heads=2, seed=3)
    path = tmp_path_factory.mktemp("emb")
    model.save_pretrained(path)
    write_hf_tokenizer(path)
    return model, str(path)


def reference_embeddings(model, texts, instruction=None):
    """The Qwen3-Embedding model card's recipe: text + <|endoftext|>, left padding, last token."""
    tok = QwenOfflineTokenizer()
    if instruction is not None:
        texts = [f"Instruct: {instruction}\nQuery:{t}" for t in texts]
    rows = [tok.encode(t) + [tok.token_id("<|endoftext|>")] for t in texts]
    n = max(map(len, rows))
    ids = np.zeros((len(rows), n), np.int64)
    mask = np.zeros((len(rows), n), np.int64)
    for i, r in enumerate(rows):
        ids[i, n - len(r):], mask[i, n - len(r):] = r, 1
    with torch.no_grad():
        h = model(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask)).last_hidden_state[:, -1]
        return torch.nn.functional.normalize(h, p=2, dim=1).numpy()


def test_parity_with_transformers_qwen3model(hf_embedder):
    model, path = hf_embedder
    ours = embedding.Qwen3Embedder.from_pretrained(path, batch_size=4, min_bucket=8)
    got = ours(TEXTS)  # 5 texts: two batches, different length buckets
    ref = reference_embeddings(model, TEXTS)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(got, ref, atol=2e-5)
    # The query format changes the embedding exactly as the recipe does.
    task = "Given an observation, retrieve the matching world state"
    np.testing.assert_allclose(ours(TEXTS[:2], instruction=task),
                               reference_embeddings(model, TEXTS[:2], instruction=task), atol=2e-5)


def test_sharded_equals_unsharded(hf_embedder):
    _, path = hf_embedder
    plain = embedding.Qwen3Embedder.from_pretrained(path, batch_size=4)(TEXTS)
    for shape in [(2, 2, 2), (1, 2, 4), (4, 1, 2)]:
        mesh = sharding.make_mesh(sharding.MeshConfig(*shape))
        sharded = embedding.Qwen3Embedder.from_pretrained(path, mesh=mesh, batch_size=4)
        assert sharded.params["layers"]["q"].sharding.mesh.shape == mesh.shape
        np.testing.assert_allclose(sharded(TEXTS), plain, atol=1e-5)


def test_truncation_keeps_the_end_of_text_token(hf_embedder):
    _, path = hf_embedder
    emb = embedding.Qwen3Embedder.from_pretrained(path, max_len=16, batch_size=2)
    rows = emb.token_rows([TEXTS[-1], "short"])
    assert len(rows[0]) == 16 and rows[0][-1] == emb.eos and rows[1][-1] == emb.eos
    # Text after the cut does not matter.
    a, b = emb([TEXTS[-1], TEXTS[-1] + " and much more after the cut"])
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_a_causal_lm_config_is_refused():
    from jaxscaffold.models.config import tiny
    with pytest.raises(ValueError, match="embedding config"):
        embedding.Qwen3Embedder(tiny(), {}, QwenOfflineTokenizer())
