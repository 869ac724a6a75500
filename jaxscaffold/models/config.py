"""Qwen3 (and Qwen2.5) model configuration: a static, hashable dataclass plus presets.

The config is a jit-static argument (it decides shapes and code paths), so it is a frozen
dataclass of plain Python values. Dtypes are stored as strings to stay hashable and
printable; `param_dtype` is what the weights are stored in (f32 master weights for
training), `compute_dtype` what the matmuls run in.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax.numpy as jnp

AttentionImpl = Literal["auto", "xla", "flash", "cudnn", "splash"]
ATTENTION_IMPLS: tuple[str, ...] = ("auto", "xla", "flash", "cudnn", "splash")
RematPolicy = Literal["none", "full", "save_dots"]
# HF `model_type`s the one functional model covers. qwen2 (Qwen2 / Qwen2.5): biases on the
# q/k/v projections and no q/k RMSNorm; otherwise the same decoder as qwen3.
ModelType = Literal["qwen3", "qwen2"]
MODEL_TYPES: tuple[str, ...] = ("qwen3", "qwen2")


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    """Architecture and execution options of a Qwen3 (or Qwen2.5) dense decoder (or embedder)."""

    vocab_size: int = 151936
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_layers: int = 28
    num_heads: int = 16
    num_kv_heads: int = 8
    head_dim: int = 128  # independent of hidden_size / num_heads in released models
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 40960
    # An embedding model (Qwen3-Embedding) has no lm_head; HF calls it `Qwen3Model`.
    is_embedding: bool = False
    # "qwen3", or "qwen2" for Qwen2 / Qwen2.5 checkpoints (see `qkv_bias`, `qk_norm`).
    model_type: ModelType = "qwen3"
    # Execution options (not part of the architecture).
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    attention_impl: AttentionImpl = "auto"
    remat_policy: RematPolicy = "none"
    # lax.scan over layers: compile time flat in depth, and on CPU several times faster than
    # unrolling (static slices of the stacked weights get copied).
    scan_layers: bool = True
    # The platform's own dense product and embedding gather (a `qwen3.Kernels`, set by a
    # `jaxscaffold.backends` backend); None: the portable jnp ones.
    kernels: Any = None

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"unknown model_type {self.model_type!r} (one of {', '.join(MODEL_TYPES)})")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(f"unknown attention_impl {self.attention_impl!r} (one of {', '.join(ATTENTION_IMPLS)})")
        for field in ("param_dtype", "compute_dtype"):
            jnp.dtype(getattr(self, field))  # fails early on a typo

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def qkv_bias(self) -> bool:
        """Whether the q/k/v projections carry biases (Qwen2's attention; o has none)."""
        return self.model_type == "qwen2"

    @property
    def qk_norm(self) -> bool:
        """Whether queries and keys are RMS-normed per head before RoPE (Qwen3's attention)."""
        return self.model_type == "qwen3"

    @property
    def has_lm_head(self) -> bool:
        """Whether a separate `lm_head` matrix exists (untied causal LM)."""
        return not self.is_embedding and not self.tie_word_embeddings

    def ids_outside_vocabulary(self, ids) -> list[int]:
        """The token ids of `ids` this model has no row for, sorted (a stop or end id named for
        another tokenizer: a turn would never end at it)."""
        return sorted(i for i in set(ids) if not 0 <= i < self.vocab_size)

    def replace(self, **changes) -> "Qwen3Config":
        return dataclasses.replace(self, **changes)

    def num_params(self) -> int:
        d, f = self.hidden_size, self.intermediate_size
        per_layer = 2 * d * (self.q_dim + self.kv_dim) + 3 * d * f + 2 * d
        per_layer += 2 * self.head_dim if self.qk_norm else 0
        per_layer += self.q_dim + 2 * self.kv_dim if self.qkv_bias else 0
        head = self.vocab_size * d if self.has_lm_head else 0
        return self.vocab_size * d + self.num_layers * per_layer + d + head


def _preset(hidden, inter, layers, heads, kv, tied, **kw) -> Qwen3Config:
    return Qwen3Config(
        hidden_size=hidden, intermediate_size=inter, num_layers=layers, num_heads=heads,
        num_kv_heads=kv, tie_word_embeddings=tied, **kw,
    )


# Sizes from the released checkpoints' config.json files.
_QWEN25 = dict(model_type="qwen2", max_position_embeddings=32768)
PRESETS: dict[str, Qwen3Config] = {
    "qwen3-0.6b": _preset(1024, 3072, 28, 16, 8, True),
    "qwen3-1.7b": _preset(2048, 6144, 28, 16, 8, True),
    "qwen3-4b": _preset(2560, 9728, 36, 32, 8, True),
    "qwen3-8b": _preset(4096, 12288, 36, 32, 8, False),
    "qwen3-14b": _preset(5120, 17408, 40, 40, 8, False),
    "qwen3-32b": _preset(5120, 25600, 64, 64, 8, False),
    "qwen3-embedding-0.6b": _preset(
        1024, 3072, 28, 16, 8, True, is_embedding=True, vocab_size=151669,
        max_position_embeddings=32768),
    "qwen3-embedding-4b": _preset(
        2560, 9728, 36, 32, 8, True, is_embedding=True, vocab_size=151665,
        max_position_embeddings=40960),
    "qwen3-embedding-8b": _preset(
        4096, 12288, 36, 32, 8, False, is_embedding=True, vocab_size=151665,
        max_position_embeddings=40960),
    # Qwen2.5 instruct models (the paper's ALFWorld base is qwen2.5-7b); rope_theta 1e6,
    # sliding window off, head_dim = hidden / heads. The small ones tie their embeddings.
    "qwen2.5-0.5b": _preset(896, 4864, 24, 14, 2, True, head_dim=64, **_QWEN25),
    "qwen2.5-1.5b": _preset(1536, 8960, 28, 12, 2, True, **_QWEN25),
    "qwen2.5-3b": _preset(2048, 11008, 36, 16, 2, True, **_QWEN25),
    "qwen2.5-7b": _preset(3584, 18944, 28, 28, 4, False, **(_QWEN25 | dict(vocab_size=152064))),
}


def preset(name: str, **overrides) -> Qwen3Config:
    """A released model's architecture by name (case-insensitive), with optional overrides."""
    key = name.lower()
    if key not in PRESETS:
        raise KeyError(f"unknown Qwen3 preset {name!r} (Qwen3 or Qwen2.5); known: {', '.join(PRESETS)}")
    return PRESETS[key].replace(**overrides)


def tiny(**overrides) -> Qwen3Config:
    """A tiny random-weight config for tests and the CPU demo (Qwen3 vocabulary); pass
    model_type="qwen2" for the Qwen2.5 architecture."""
    base = Qwen3Config(
        vocab_size=151936, hidden_size=64, intermediate_size=192, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=16, tie_word_embeddings=True,
    )
    return base.replace(**overrides)
