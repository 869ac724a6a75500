"""Qwen3-Embedding on the Qwen3 port: last-token pooling, L2 normalisation, batched and jitted.

Qwen3-Embedding reads a text followed by `<|endoftext|>` and takes the final-normed hidden
state of that last token as the embedding (normalised to unit length). Queries, not
documents, get an instruction: `Instruct: {task}\\nQuery:{text}`.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxscaffold.buckets import pow2_bucket
from jaxscaffold.models import hf_io, qwen3
from jaxscaffold.models.config import Qwen3Config
from jaxscaffold.models.sharded_attention import kernel_mesh
from jaxscaffold.models.sharding import DEFAULT_RULES, ShardingRules
from jaxscaffold.models.tokenizer import Tokenizer, load_tokenizer

END_OF_TEXT = "<|endoftext|>"


def query_text(text: str, instruction: str) -> str:
    """The query format Qwen3-Embedding was trained with."""
    return f"Instruct: {instruction}\nQuery:{text}"


def embed(params: dict, config: Qwen3Config, tokens_BT, segment_ids_BT):
    """Unit-length embeddings emb_BD of right-padded rows (segment 0 = padding): the
    final-normed hidden state of each row's last real token."""
    h_BTD = qwen3.hidden_states(params, config, tokens_BT, segment_ids_BT=segment_ids_BT)
    last_B = jnp.maximum(jnp.sum(segment_ids_BT > 0, axis=1) - 1, 0)
    emb_BD = jnp.take_along_axis(h_BTD, last_B[:, None, None], axis=1)[:, 0].astype(jnp.float32)
    return emb_BD / jnp.maximum(jnp.linalg.norm(emb_BD, axis=-1, keepdims=True), 1e-12)


class Qwen3Embedder:
    """texts -> [N, D] float32 unit embeddings, in fixed-shape batches (a few compiled programs).

    Rows are tokenized, cut to `max_len` tokens (the end-of-text token is always kept last),
    right-padded to a power-of-two length bucket, and run `batch_size` at a time. With a mesh,
    parameters are sharded by the rules and rows over the batch axes.
    """

    def __init__(self, config: Qwen3Config, params: dict, tokenizer: Tokenizer, *, mesh=None,
                 max_len: int = 512, batch_size: int = 32, min_bucket: int = 32,
                 rules: ShardingRules = DEFAULT_RULES, backend=None):
        """`backend`: a `jaxscaffold.backends` backend, whose `with_attention` picks the
        platform's attention kernel for "auto" (cuDNN, splash); None, the portable one."""
        if not config.is_embedding:
            raise ValueError("Qwen3Embedder needs an embedding config (is_embedding=True, HF Qwen3Model)")
        if backend is not None:
            config = backend.with_attention(config)
        self.config, self.params, self.tokenizer = config, params, tokenizer
        self.max_len, self.batch_size, self.min_bucket = max_len, batch_size, min_bucket
        self.eos = tokenizer.token_id(END_OF_TEXT)
        self.mesh = mesh

        def fn(p, t, s):
            with kernel_mesh(mesh, rules):  # fused attention kernels run per device under shard_map
                return embed(p, config, t, s)

        if mesh is None:
            self._embed = jax.jit(fn)
            self._rows = None
        else:
            self._rows = rules.sharding(mesh, ("batch", "seq"))
            self._embed = jax.jit(fn, out_shardings=NamedSharding(mesh, PartitionSpec()))

    @classmethod
    def from_pretrained(cls, path: str, *, mesh=None, dtype: str = "float32", compute_dtype: str = "float32",
                        tokenizer: str | None = None, **kwargs) -> "Qwen3Embedder":
        """A local HF Qwen3-Embedding directory (its own tokenizer unless `tokenizer` is given)."""
        config, params = hf_io.load_pretrained(path, dtype=dtype, mesh=mesh, compute_dtype=compute_dtype)
        if not config.is_embedding:
            config = config.replace(is_embedding=True)  # a causal LM's trunk used as an embedder
            params = {k: v for k, v in params.items() if k != "lm_head"}
        return cls(config, params, load_tokenizer(tokenizer or path), mesh=mesh, **kwargs)

    def token_rows(self, texts: Sequence[str]) -> list[list[int]]:
        rows = []
        for text in texts:
            ids = self.tokenizer.encode(text)[: self.max_len - 1]
            rows.append(ids + [self.eos])
        return rows

    def __call__(self, texts: Sequence[str], instruction: str | None = None) -> np.ndarray:
        if instruction is not None:
            texts = [query_text(t, instruction) for t in texts]
        rows = self.token_rows(texts)
        out = np.zeros((len(rows), self.config.hidden_size), np.float32)
        # Longest first: rows of similar length share a batch, so fewer tokens are padding.
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            t = pow2_bucket(max(len(rows[i]) for i in idx), self.min_bucket)
            tokens = np.zeros((self.batch_size, t), np.int32)
            segments = np.zeros((self.batch_size, t), np.int32)
            for r, i in enumerate(idx):
                tokens[r, :len(rows[i])] = rows[i]
                segments[r, :len(rows[i])] = 1
            if self._rows is not None:
                tokens, segments = jax.device_put((tokens, segments), self._rows)
            out[idx] = np.asarray(self._embed(self.params, tokens, segments))[:len(idx)]
        return out
