"""Per-token log-probabilities and entropies without materialising [B, T, V] logits.

The unembedding and log-softmax run over chunks of the sequence inside a `lax.scan`, each
chunk under `jax.checkpoint`: the forward keeps only a chunk's [B, C, V] logits at a time,
and the backward recomputes them chunk by chunk instead of storing them. At Qwen3's vocab of
151936 this is the difference between gigabytes and megabytes of activations.

Alignment convention (used across `rl`): position t holds log p(tokens[t] | tokens[<t]),
so `logp_BT[:, 0] = 0` and a loss mask marks the positions of the tokens being trained on.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxscaffold.models import qwen3
from jaxscaffold.models.config import Qwen3Config


def _chunk_stats(params, config, h_BCD, targets_BC):
    logits = qwen3.unembed(params, config, h_BCD)  # f32 [B, C, V], one chunk only
    # One exponential over the vocabulary serves the normaliser, the probabilities and the
    # backward pass (autodiff reuses it); logsumexp followed by exp(logits - lse) took two
    # passes forward and more backward, and the vocabulary-wide passes dominate a small
    # model's step. The max is only a shift: every output is invariant to it.
    shifted = logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    exp = jnp.exp(shifted)
    total = jnp.sum(exp, axis=-1)
    log_total = jnp.log(total)
    probs = exp / total[..., None]
    target = jnp.take_along_axis(shifted, targets_BC[..., None], axis=-1)[..., 0]
    entropy = log_total - jnp.sum(probs * shifted, axis=-1)
    return target - log_total, entropy


def _chunk_size(n: int, chunk: int) -> int:
    """Positions per chunk: at most `chunk`, as few chunks as that allows, evenly sized, so the
    padding is under one position per chunk (192 positions in chunks of at most 128: two of 96,
    not two of 128, whose padding the unembedding would compute too)."""
    chunks = -(-n // max(1, chunk))
    return -(-n // chunks)


def logprobs_from_hidden(params, config: Qwen3Config, h_BTD, tokens_BT, *, chunk: int = 256):
    """(logp_BT, entropy_BT) of `tokens_BT` given final hidden states, chunked over T.

    logp_BT[:, t] = log p(tokens[t] | < t) for t >= 1 and 0 at t = 0; entropy likewise
    of the distribution that predicted token t.
    """
    b, t, d = h_BTD.shape
    n = t - 1
    if n <= 0:
        zeros = jnp.zeros((b, t), jnp.float32)
        return zeros, zeros
    c = _chunk_size(n, chunk)
    pad = (-n) % c
    h = jnp.pad(h_BTD[:, :-1], ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(tokens_BT[:, 1:], ((0, 0), (0, pad)))
    k = (n + pad) // c
    h_KBCD = h.reshape(b, k, c, d).swapaxes(0, 1)
    t_KBC = targets.reshape(b, k, c).swapaxes(0, 1)
    stats = jax.checkpoint(lambda hc, tc: _chunk_stats(params, config, hc, tc))

    def body(_, xs):
        return None, stats(*xs)

    _, (logp, ent) = jax.lax.scan(body, None, (h_KBCD, t_KBC))
    logp = logp.swapaxes(0, 1).reshape(b, -1)[:, :n]
    ent = ent.swapaxes(0, 1).reshape(b, -1)[:, :n]
    first = jnp.zeros((b, 1), jnp.float32)
    return jnp.concatenate([first, logp], 1), jnp.concatenate([first, ent], 1)


def token_logprobs(params, config: Qwen3Config, tokens_BT, *, segment_ids_BT=None, positions_BT=None,
                   chunk: int = 256):
    """(logp_BT, entropy_BT) of a batch under the model (teacher forcing)."""
    h = qwen3.hidden_states(params, config, tokens_BT, segment_ids_BT=segment_ids_BT,
                            positions_BT=positions_BT)
    return logprobs_from_hidden(params, config, h, tokens_BT, chunk=chunk)


def masked_token_logprobs(params, config: Qwen3Config, tokens_BT, mask_BT, num_positions: int, *,
                          segment_ids_BT=None, chunk: int = 256):
    """`token_logprobs` where only the first `num_positions` masked positions of each row are
    scored (the unembedding runs on [B, K] instead of [B, T]); every other position reads 0.

    The loss only reads masked positions (model tokens), so with `num_positions` >= the
    largest masked count of a row this equals `token_logprobs` wherever the mask is 1. In
    multi-turn rows most tokens are prompt and environment text, and the unembedding at
    Qwen3's vocabulary is a large part of a small model's step.
    """
    b, t = tokens_BT.shape
    num_positions = min(num_positions, t)
    h = qwen3.hidden_states(params, config, tokens_BT, segment_ids_BT=segment_ids_BT)
    index = jnp.arange(t, dtype=jnp.int32)
    # Masked positions first, in order (position 0 is never scored: nothing predicts it).
    keys = jnp.where((mask_BT > 0) & (index > 0), index, t + index)
    pos_BK = jnp.argsort(keys, axis=1)[:, :num_positions].astype(jnp.int32)
    scored_BK = jnp.take_along_axis(keys, pos_BK, axis=1) < t
    h_BKD = jnp.take_along_axis(h, jnp.maximum(pos_BK - 1, 0)[..., None], axis=1)
    targets_BK = jnp.take_along_axis(tokens_BT, pos_BK, axis=1)
    k = num_positions
    c = _chunk_size(k, chunk)
    pad = (-k) % c
    h_KBCD = jnp.pad(h_BKD, ((0, 0), (0, pad), (0, 0))).reshape(b, -1, c, h.shape[-1]).swapaxes(0, 1)
    t_KBC = jnp.pad(targets_BK, ((0, 0), (0, pad))).reshape(b, -1, c).swapaxes(0, 1)
    stats = jax.checkpoint(lambda hc, tc: _chunk_stats(params, config, hc, tc))
    _, (logp, ent) = jax.lax.scan(lambda _, xs: (None, stats(*xs)), None, (h_KBCD, t_KBC))
    logp = jnp.where(scored_BK, logp.swapaxes(0, 1).reshape(b, -1)[:, :k], 0.0)
    ent = jnp.where(scored_BK, ent.swapaxes(0, 1).reshape(b, -1)[:, :k], 0.0)
    rows = jnp.arange(b)[:, None]
    # Distinct positions per row (an argsort), so the scatter never adds two values together.
    return (jnp.zeros((b, t), jnp.float32).at[rows, pos_BK].set(logp),
            jnp.zeros((b, t), jnp.float32).at[rows, pos_BK].set(ent))
