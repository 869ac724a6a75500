"""Choosing the next token: temperature, top-k, top-p or greedy, with per-row keys.

Besides the token, we return its log-probability under the *unmodified* policy
(temperature 1, no truncation), which is what an RL loss needs as the old logprob, and
under the distribution actually sampled from (for importance-sampling corrections).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How tokens are drawn (static: each distinct value compiles its own decode program)."""

    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0  # nucleus mass kept; 1 = off
    top_k: int = 0  # 0 = off

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"invalid sampling config {self}")


GREEDY = SamplingConfig(temperature=0.0)


def sampling_logits(logits_BV, cfg: SamplingConfig):
    """The logits of the distribution actually sampled from (-inf outside top-k / top-p)."""
    scaled = logits_BV.astype(jnp.float32) / cfg.temperature
    if cfg.top_k:
        kth = jax.lax.top_k(scaled, cfg.top_k)[0][:, -1:]
        scaled = jnp.where(scaled < kth, -jnp.inf, scaled)
    if cfg.top_p < 1.0:
        desc = -jnp.sort(-scaled, axis=-1)
        probs = jax.nn.softmax(desc, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        keep = mass_before < cfg.top_p
        threshold = jnp.min(jnp.where(keep, desc, jnp.inf), axis=-1, keepdims=True)
        scaled = jnp.where(scaled < threshold, -jnp.inf, scaled)
    return scaled


def sample(logits_BV, keys_B, cfg: SamplingConfig):
    """Returns (token_B, policy_logprob_B, sampling_logprob_B)."""
    logits_BV = logits_BV.astype(jnp.float32)
    policy_logp = jax.nn.log_softmax(logits_BV, axis=-1)
    if cfg.greedy:
        token = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
        sampled_logp = jnp.zeros(token.shape, jnp.float32)  # a point mass: log 1
    else:
        scaled = sampling_logits(logits_BV, cfg)
        token = jax.vmap(jax.random.categorical)(keys_B, scaled).astype(jnp.int32)
        sampled_logp = jnp.take_along_axis(jax.nn.log_softmax(scaled, -1), token[:, None], -1)[:, 0]
    return token, jnp.take_along_axis(policy_logp, token[:, None], -1)[:, 0], sampled_logp
