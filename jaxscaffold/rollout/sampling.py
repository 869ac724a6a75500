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


def _smallest_true(pred, lo_B, hi_B):
    """Per row, the smallest uint32 x in [lo, hi] with pred(x), for a pred that is monotone
    (false, then true) with pred(hi) true: 32 steps of bisection, exact. Both nucleus and
    top-k thresholds are found this way over float bit patterns instead of sorting the
    vocabulary (a sort costs far more on CPU: about 50 ms a decode step at V = 32000, and
    XLA:CPU's top-k 350 ms at V = 151936 and B = 8; this, about 12 ms)."""
    def step(_, bounds):  # invariant: pred(hi), and not pred(x) for every x < lo
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        ok = pred(mid)
        return jnp.where(ok, lo, mid + 1), jnp.where(ok, mid, hi)

    _, hi = jax.lax.fori_loop(0, 32, step, (lo_B, hi_B))
    return hi


def _top_p_threshold(probs_BV, top_p: float):
    """The smallest probability kept by nucleus sampling, per row.

    Token j is kept iff the mass of the tokens strictly more likely than it is below top_p
    (the smallest prefix of the sorted distribution whose mass reaches top_p, ties at its
    edge included). That mass only falls as p_j grows, so the kept set is {p_j >= x*} for
    the smallest x* with mass(> x*) < top_p; non-negative floats order like their bit
    patterns, so x* is found by bisection over the bits."""
    bits_BV = jax.lax.bitcast_convert_type(probs_BV, jnp.uint32)

    def mass_below_top_p(x_B):
        return jnp.sum(jnp.where(bits_BV > x_B[:, None], probs_BV, 0.0), axis=-1) < top_p

    x = _smallest_true(mass_below_top_p, jnp.zeros(probs_BV.shape[:1], jnp.uint32), jnp.max(bits_BV, axis=-1))
    return jax.lax.bitcast_convert_type(x, jnp.float32)


def _kth_largest(x_BV, k: int):
    """Each row's k-th largest value (ties counted), instead of `lax.top_k`.

    It is the smallest x with fewer than k entries > x. Floats map to uint32 keys that order
    like them (negatives bit-flipped, the sign bit set on the rest), so bisection over the
    keys finds it exactly."""
    bits = jax.lax.bitcast_convert_type(x_BV, jnp.uint32)
    key_BV = jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(1 << 31))

    def fewer_than_k_above(m_B):
        return jnp.sum(key_BV > m_B[:, None], axis=-1) < k

    key_B = _smallest_true(fewer_than_k_above, jnp.min(key_BV, axis=-1), jnp.max(key_BV, axis=-1))
    bits = jnp.where(key_B >> 31 == 1, key_B & jnp.uint32((1 << 31) - 1), ~key_B)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def sampling_logits(logits_BV, cfg: SamplingConfig):
    """The logits of the distribution actually sampled from (-inf outside top-k / top-p)."""
    scaled = logits_BV.astype(jnp.float32) / cfg.temperature
    if cfg.top_k:
        kth = _kth_largest(scaled, min(cfg.top_k, scaled.shape[-1]))[:, None]
        scaled = jnp.where(scaled < kth, -jnp.inf, scaled)
    if cfg.top_p < 1.0:
        probs = jax.nn.softmax(scaled, axis=-1)
        threshold = _top_p_threshold(probs, cfg.top_p)
        scaled = jnp.where(probs < threshold[:, None], -jnp.inf, scaled)
    return scaled


_BLOCK = 1024  # inverse-CDF blocks: a cumsum over V / 1024 block sums, then within one block


def _inverse_cdf(probs_BV, u_B):
    """Index drawn from each row's (unnormalised) probabilities given a uniform u in [0, 1):
    the first j whose cumulative mass exceeds u * total, found in two levels (block, then
    within the block) so no full-vocabulary cumsum is needed. One random number per row
    instead of Gumbel noise over the whole vocabulary (about 5x cheaper on CPU at V = 32000)."""
    b, v = probs_BV.shape
    n = -(-v // _BLOCK)
    blocks_BNC = jnp.pad(probs_BV, ((0, 0), (0, n * _BLOCK - v))).reshape(b, n, _BLOCK)
    sums_BN = jnp.sum(blocks_BNC, axis=-1)
    csum_BN = jnp.cumsum(sums_BN, axis=-1)
    target_B = u_B * csum_BN[:, -1]
    # Never land on an empty block or token through rounding at the top end: cap at the last
    # one with mass.
    last_block = jnp.max(jnp.where(sums_BN > 0, jnp.arange(n), 0), axis=-1)
    i_B = jnp.minimum(jnp.sum(csum_BN <= target_B[:, None], axis=-1), last_block)
    before_B = jnp.take_along_axis(csum_BN - sums_BN, i_B[:, None], axis=-1)[:, 0]
    row_BC = jnp.take_along_axis(blocks_BNC, i_B[:, None, None], axis=1)[:, 0]
    last_token = jnp.max(jnp.where(row_BC > 0, jnp.arange(_BLOCK), 0), axis=-1)
    j_B = jnp.minimum(jnp.sum(jnp.cumsum(row_BC, axis=-1) <= (target_B - before_B)[:, None], axis=-1), last_token)
    return (i_B * _BLOCK + j_B).astype(jnp.int32)


def sample(logits_BV, keys_B, cfg: SamplingConfig):
    """Returns (token_B, policy_logprob_B, sampling_logprob_B)."""
    logits_BV = logits_BV.astype(jnp.float32)
    policy_logp = jax.nn.log_softmax(logits_BV, axis=-1)
    if cfg.greedy:
        token = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
        sampled_logp = jnp.zeros(token.shape, jnp.float32)  # a point mass: log 1
    else:
        plain = cfg.temperature == 1.0 and cfg.top_k == 0 and cfg.top_p == 1.0
        sampled_logp_BV = policy_logp if plain else jax.nn.log_softmax(sampling_logits(logits_BV, cfg), -1)
        u = jax.vmap(jax.random.uniform)(keys_B)
        token = _inverse_cdf(jnp.exp(sampled_logp_BV), u)
        sampled_logp = jnp.take_along_axis(sampled_logp_BV, token[:, None], -1)[:, 0]
    return token, jnp.take_along_axis(policy_logp, token[:, None], -1)[:, 0], sampled_logp
