"""Plain-loop float64 NumPy reference of the policy losses and advantages, written from the formulas.

Nothing here shares code or vectorised tricks with jaxscaffold.rl: every quantity is a loop
over rows and tokens, and gradients w.r.t. logp are derived by hand:

- ppo:  loss_t = max(-A r, -A clip(r)), r = exp(clamp(lr)), so d loss_t / d logp_t = -A r when
        the unclipped term is the one selected (and the dual clip is not), else 0;
- gspo: the token form's value is s_i and d s_it / d logp_t = s_i (only through its own logp_t,
        stop-gradients elsewhere), so d loss_t / d logp_t = -A s_i when unclipped, else 0;
- each aggregation is a weighted token sum, loss = sum_t w_t loss_t, so grad_t = w_t g_t.
"""

from __future__ import annotations

import math

import numpy as np


# ---------------------------------------------------------------- advantages


def advantages(rewards, group_ids, estimator="grpo", eps=1e-6, norm_std=True, batch_norm=False,
               traj_ids=None, count="trajectory"):  # fmt: skip
    n = len(rewards)
    # Units: what a group statistic counts (a trajectory once, or every row).
    if traj_ids is not None and count == "trajectory":
        unit_key = [traj_ids[i] for i in range(n)]
    else:
        unit_key = list(range(n))
    units = []  # unit keys in first-seen order
    unit_score, unit_group = {}, {}
    for i in range(n):
        k = unit_key[i]
        if k not in unit_score:
            units.append(k)
            unit_score[k] = float(rewards[i])
            unit_group[k] = group_ids[i]
    members = {}
    for k in units:
        members.setdefault(unit_group[k], []).append(k)

    unit_adv = {}
    for g, ks in members.items():
        scores = [unit_score[k] for k in ks]
        m = len(scores)
        mean = sum(scores) / m
        for k in ks:
            s = unit_score[k]
            if m == 1:
                unit_adv[k] = s
            elif estimator == "rloo":
                unit_adv[k] = s - (sum(scores) - s) / (m - 1)
            elif estimator == "grpo" and norm_std:
                std = math.sqrt(sum((x - mean) ** 2 for x in scores) / (m - 1))
                unit_adv[k] = (s - mean) / (std + eps)
            else:
                unit_adv[k] = s - mean
    if batch_norm:
        vals = [unit_adv[k] for k in units]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((x - mean) ** 2 for x in vals) / (len(vals) - 1))
        for k in units:
            unit_adv[k] = (unit_adv[k] - mean) / (std + eps)
    return np.array([unit_adv[unit_key[i]] for i in range(n)])


# ---------------------------------------------------------------- aggregation weights


def agg_weights(mask, agg, agg_constant=None):
    """w[b][t] such that agg(x) = sum_bt w[b][t] x[b][t] (0 on masked tokens)."""
    B, T = len(mask), len(mask[0])
    lens = [sum(1 for t in range(T) if mask[b][t]) for b in range(B)]
    n_tok = sum(lens)
    n_seq = sum(1 for L in lens if L > 0)
    w = np.zeros((B, T))
    for b in range(B):
        for t in range(T):
            if not mask[b][t]:
                continue
            if agg == "token-mean":
                w[b, t] = 1.0 / n_tok
            elif agg == "seq-mean-token-mean":
                w[b, t] = 1.0 / (lens[b] * n_seq)
            elif agg == "seq-mean-token-sum":
                w[b, t] = 1.0 / n_seq
            elif agg == "seq-mean-token-sum-norm":
                w[b, t] = 1.0 / (n_seq * agg_constant)
            else:
                raise ValueError(agg)
    return w


# ---------------------------------------------------------------- per-token surrogate


def token_loss_and_grad(logp, old, adv, mask, mode="ppo", clip_low=0.2, clip_high=0.2, clip_c=None):
    """Per-token loss, ratio and d loss_t / d logp_t (float64 arrays [B, T])."""
    B, T = len(logp), len(logp[0])
    loss = np.zeros((B, T))
    ratio = np.zeros((B, T))
    grad = np.zeros((B, T))
    for b in range(B):
        A = float(adv[b])
        if mode == "gspo":
            n = sum(1 for t in range(T) if mask[b][t])
            total = sum(logp[b][t] - old[b][t] for t in range(T) if mask[b][t])
            seq_lr = total / n if n else 0.0
        for t in range(T):
            if not mask[b][t]:
                continue  # padding: no loss, no gradient
            if mode == "ppo":
                lr = min(max(logp[b][t] - old[b][t], -20.0), 20.0)
                r = math.exp(lr)
                dr = r if -20.0 < logp[b][t] - old[b][t] < 20.0 else 0.0
            else:
                log_s = seq_lr
                r = math.exp(min(log_s, 10.0))
                dr = r if log_s < 10.0 else 0.0
            r_clip = min(max(r, 1.0 - clip_low), 1.0 + clip_high)
            unclipped, clipped = -A * r, -A * r_clip
            if unclipped >= clipped:
                value, g = unclipped, -A * dr
            else:
                value, g = clipped, 0.0
            if clip_c is not None and A < 0 and -A * clip_c < value:
                value, g = -A * clip_c, 0.0
            loss[b, t], ratio[b, t], grad[b, t] = value, r, g
    return loss, ratio, grad


def kl_and_grad(logp, ref, mask, estimator):
    """Per-token KL estimate and its derivative w.r.t. logp (0 on padding)."""
    B, T = len(logp), len(logp[0])
    val = np.zeros((B, T))
    der = np.zeros((B, T))
    for b in range(B):
        for t in range(T):
            if not mask[b][t]:
                continue
            lr = logp[b][t] - ref[b][t]
            if estimator == "k1":
                val[b, t], der[b, t] = lr, 1.0
            elif estimator == "k2":
                val[b, t], der[b, t] = 0.5 * lr * lr, lr
            else:  # k3 = exp(-lr) + lr - 1, with verl's clamps
                x = min(max(-lr, -20.0), 20.0)
                k = math.exp(x) - x - 1.0
                inner = 1.0 if -20.0 < -lr < 20.0 else 0.0
                d = (1.0 - math.exp(x)) * inner
                if k > 10.0:
                    k, d = 10.0, 0.0
                val[b, t], der[b, t] = k, d
    return val, der


# ---------------------------------------------------------------- the full loss


def policy_loss(logp, old, adv, mask, mode="ppo", clip_low=0.2, clip_high=0.2, clip_c=None, agg="token-mean",
                ref=None, kl_coef=0.0, kl_estimator="k3", agg_constant=None, entropy=None, entropy_coef=0.0):  # fmt: skip
    """(loss, d loss / d logp [B, T], metrics) in float64."""
    logp, old, mask = np.asarray(logp, float), np.asarray(old, float), np.asarray(mask)
    B, T = logp.shape
    w = agg_weights(mask, agg, agg_constant)
    tok_w = agg_weights(mask, "token-mean")
    tl, ratio, tg = token_loss_and_grad(logp, old, adv, mask, mode, clip_low, clip_high, clip_c)
    pg = sum(w[b, t] * tl[b, t] for b in range(B) for t in range(T))
    grad = np.zeros((B, T))
    for b in range(B):
        for t in range(T):
            grad[b, t] = w[b, t] * tg[b, t]
    loss = pg
    metrics = {"pg_loss": pg}
    if ref is not None:
        kv, kd = kl_and_grad(logp, ref, mask, kl_estimator)
        loss += kl_coef * sum(w[b, t] * kv[b, t] for b in range(B) for t in range(T))
        for b in range(B):
            for t in range(T):
                grad[b, t] += kl_coef * w[b, t] * kd[b, t]
        metrics["kl"] = sum(tok_w[b, t] * kv[b, t] for b in range(B) for t in range(T))
    if entropy is not None:
        loss -= entropy_coef * sum(w[b, t] * entropy[b][t] for b in range(B) for t in range(T) if mask[b][t])
        metrics["entropy"] = sum(tok_w[b, t] * entropy[b][t] for b in range(B) for t in range(T) if mask[b][t])

    upper = lower = dual = akl = rsum = 0.0
    rmin, rmax = math.inf, -math.inf
    for b in range(B):
        A = float(adv[b])
        for t in range(T):
            if not mask[b][t]:
                continue
            r = ratio[b, t]
            upper += tok_w[b, t] * (A > 0 and r > 1 + clip_high)
            lower += tok_w[b, t] * (A < 0 and r < 1 - clip_low)
            dual += tok_w[b, t] * (clip_c is not None and A < 0 and r > clip_c)
            q = math.exp(min(max(logp[b, t] - old[b, t], -20.0), 20.0))
            akl += tok_w[b, t] * ((q - 1.0) - math.log(q))
            rsum += tok_w[b, t] * r
            rmin, rmax = min(rmin, r), max(rmax, r)
    metrics.update(loss=loss, clipfrac_upper=upper, clipfrac_lower=lower, clipfrac_dual=dual, approx_kl=akl,
                   ratio_mean=rsum, ratio_min=rmin, ratio_max=rmax)  # fmt: skip
    return loss, grad, metrics


def finite_difference_grad(fn, x, h=1e-6):
    """Central differences of a float64 scalar function of an array."""
    x = np.asarray(x, float)
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        g[idx] = (fn(xp) - fn(xm)) / (2 * h)
    return g


# ---------------------------------------------------------------- DAPO


def overlong_penalty(length, max_len, buffer, factor):
    expected = max_len - buffer
    if length <= expected:
        return 0.0
    if length >= max_len:
        return -factor
    return -(length - expected) / buffer * factor
