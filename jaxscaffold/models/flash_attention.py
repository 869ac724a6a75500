"""Memory-efficient causal self-attention in pure JAX (`attention_impl="flash"`).

Keys are visited block by block with an online softmax, so no [T, T] score matrix is ever
held: a step holds one [block, block] score tile per head. The `jax.custom_vjp` saves only
the output and the log-sum-exp of each query and recomputes the tiles in the backward pass,
so a layer's attention memory is O(T x block), not O(T^2) (the FlashAttention recipe, Dao et
al. 2022). Tiles above the causal diagonal are never computed (query block i reads key
blocks 0..i). It runs on every backend and under any mesh (XLA partitions its loops over
batch and heads); on TPU / GPU it is the portable stand-in for splash / cuDNN, which are
O(T) in memory too.

Masking follows `models.attention`: a query attends to keys of its own non-zero segment at
or before its position. Fully masked queries (padding) output zeros.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

BLOCK = 512  # tokens per query / key tile: [512, 512] f32 scores per head a step


def _tiles(x, n: int, size: int):
    """[B, n * size, ...] -> [n, B, size, ...]: tiles leading, for dynamic indexing."""
    return jnp.moveaxis(x.reshape(x.shape[0], n, size, *x.shape[2:]), 1, 0)


def _tile_mask(seg_q, seg_k, i, j, size):
    """[B, 1, 1, Tq, Tk] mask of query tile i against key tile j."""
    pos_q = i * size + jnp.arange(size)
    pos_k = j * size + jnp.arange(size)
    ok = (seg_q[:, :, None] == seg_k[:, None, :]) & (seg_k[:, None, :] != 0)
    ok = ok & (pos_k[None, None, :] <= pos_q[None, :, None])
    return ok[:, None, None]


def _scores(q_BQGRK, k_BKGK):
    return jnp.einsum("bqgrd,bkgd->bgrqk", q_BQGRK, k_BKGK, preferred_element_type=jnp.float32)


def _forward(q, k, v, seg, size):
    """Output [n, B, size, G, R, K] and log-sum-exp [n, B, G, R, size] of tiled inputs."""
    n, b, _, g, r, d = q.shape
    out = jnp.zeros(q.shape, q.dtype)
    lse = jnp.zeros((n, b, g, r, size), jnp.float32)

    def query_tile(i, carry):
        out, lse = carry
        qi, si = q[i], seg[i]

        def key_tile(j, acc):
            m, l, o = acc
            ok = _tile_mask(si, seg[j], i, j, size)
            s = jnp.where(ok, _scores(qi, k[j]), -jnp.inf)
            m_new = jnp.maximum(m, jnp.max(s, -1))
            m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
            p = jnp.where(ok, jnp.exp(s - m_safe[..., None]), 0.0)
            scale = jnp.exp(jnp.where(jnp.isfinite(m), m, m_safe) - m_safe)
            pv = jnp.einsum("bgrqk,bkgd->bgrqd", p.astype(v.dtype), v[j], preferred_element_type=jnp.float32)
            return m_new, l * scale + jnp.sum(p, -1), o * scale[..., None] + pv

        acc = (jnp.full((b, g, r, size), -jnp.inf), jnp.zeros((b, g, r, size)), jnp.zeros((b, g, r, size, d)))
        m, l, o = jax.lax.fori_loop(0, i + 1, key_tile, acc)  # causal: key tiles after i are all masked
        empty = l == 0  # a fully masked (padding) query
        o = jnp.where(empty[..., None], 0.0, o / jnp.where(empty, 1.0, l)[..., None])
        row_lse = jnp.where(empty, jnp.inf, m + jnp.log(jnp.where(empty, 1.0, l)))  # exp(s - inf) = 0 below
        return out.at[i].set(jnp.moveaxis(o, 3, 1).astype(q.dtype)), lse.at[i].set(row_lse)

    return jax.lax.fori_loop(0, n, query_tile, (out, lse))


def _backward(q, k, v, seg, out, lse, dout, size):
    """Gradients of tiled q, k, v: key tile j (outer) against query tiles j..n-1 (inner),
    each score tile recomputed from the saved log-sum-exp."""
    n = q.shape[0]
    # delta_i = sum_d dout * out: the softmax Jacobian's row term. [n, B, G, R, size]
    delta = jnp.moveaxis(jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), -1), 2, -1)

    def key_tile(j, carry):
        dq, dk, dv = carry
        kj, vj = k[j], v[j]

        def query_tile(i, acc):
            dq, dkj, dvj = acc
            ok = _tile_mask(seg[i], seg[j], i, j, size)
            s = _scores(q[i], kj)
            p = jnp.where(ok, jnp.exp(s - lse[i][..., None]), 0.0)  # [B, G, R, Tq, Tk]
            do = dout[i]  # [B, Tq, G, R, K]
            dvj = dvj + jnp.einsum("bgrqk,bqgrd->bkgd", p.astype(do.dtype), do, preferred_element_type=jnp.float32)
            dp = jnp.einsum("bqgrd,bkgd->bgrqk", do, vj, preferred_element_type=jnp.float32)
            ds = (p * (dp - delta[i][..., None])).astype(q.dtype)
            dq = dq.at[i].add(jnp.einsum("bgrqk,bkgd->bqgrd", ds, kj, preferred_element_type=jnp.float32))
            dkj = dkj + jnp.einsum("bgrqk,bqgrd->bkgd", ds, q[i], preferred_element_type=jnp.float32)
            return dq, dkj, dvj

        zeros = jnp.zeros(kj.shape, jnp.float32)
        dq, dkj, dvj = jax.lax.fori_loop(j, n, query_tile, (dq, zeros, zeros))  # causal: query tiles from j on
        return dq, dk.at[j].set(dkj), dv.at[j].set(dvj)

    init = (jnp.zeros(q.shape, jnp.float32), jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
    return jax.lax.fori_loop(0, n, key_tile, init)  # q arrives scaled: autodiff applies the scale


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash(q, k, v, seg, size):
    return _forward(q, k, v, seg, size)[0]


def _flash_fwd(q, k, v, seg, size):
    out, lse = _forward(q, k, v, seg, size)
    return out, (q, k, v, seg, out, lse)


def _flash_bwd(size, res, dout):
    q, k, v, seg, out, lse = res
    dq, dk, dv = _backward(q, k, v, seg, out, lse, dout, size)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention(q_BTHK, k_BTGK, v_BTGK, segment_ids_BT, *, block: int = BLOCK):
    """Causal GQA self-attention within segments (0 = padding), O(T x block) memory in the
    forward and backward passes. Sequences are padded to a multiple of the tile with
    segment id 0 (masked); queries whose keys are all masked output zeros."""
    b, t, h, d = q_BTHK.shape
    g = k_BTGK.shape[2]
    size = min(block, t)
    n = -(-t // size)
    pad = n * size - t

    def tiled(x):
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return _tiles(x, n, size)

    q = tiled((q_BTHK * (d ** -0.5)).astype(q_BTHK.dtype).reshape(b, t, g, h // g, d))
    out = _flash(q, tiled(k_BTGK), tiled(v_BTGK), tiled(segment_ids_BT), size)  # [n, B, size, G, R, K]
    return jnp.moveaxis(out, 0, 1).reshape(b, n * size, h, d)[:, :t]
