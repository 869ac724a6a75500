"""The policy update of one training step: episodes -> rewards (with DAPO's overlong shaping)
-> group advantages -> `ppo_epochs x num_minibatches` optimizer steps on the global batch."""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

from jaxscaffold.models.sharding import shard_batch
from jaxscaffold.rl import dapo
from jaxscaffold.rl.advantages import advantages
from jaxscaffold.train.job import Job
from jaxscaffold.train.multihost import process_batch
from jaxscaffold.episodes.episode import Episode


def train_on(job: Job, state, episodes: list[Episode]):
    """Advantages over groups, then ppo_epochs x num_minibatches optimizer steps; returns the
    new state and the `train/` metrics, the mean over those steps.

    On several processes `episodes` are this process's (whole groups, so advantages stay
    local); each process feeds its rows and every optimizer step trains on the global batch."""
    ok = [e for e in episodes if e.failure is None and e.training_rows()]
    rewards, penalty = shaped_rewards(ok, job.algo, job.cfg.rollout.max_new_tokens)
    group_ids = np.asarray([e.group for e in ok])
    adv = advantages(rewards, group_ids, **job.algo.advantage_kwargs())
    # One row per trajectory, or (step-wise) one per model turn sharing its episode's advantage.
    rows = [(conv, a) for e, a in zip(ok, adv) for conv in e.training_rows()]
    r = job.cfg.rl
    steps = []
    order = np.arange(len(rows))
    for _ in range(r.ppo_epochs):
        for mb in np.array_split(order, r.num_minibatches):
            batch = process_batch([rows[i][0] for i in mb], np.asarray([rows[i][1] for i in mb]), job.row_multiple)
            if job.mesh is not None:
                batch = shard_batch(batch, job.mesh)
            state, m = job.train_step(state, batch, *(() if job.ref_params is None else (job.ref_params,)))
            steps.append({k: float(v) for k, v in jax.device_get(m).items()})
    metrics = {k: float(np.mean([s[k] for s in steps])) for k in steps[0]} if steps else {}
    if job.algo.overlong_buffer:
        metrics["overlong_penalty"] = float(penalty.mean()) if len(penalty) else 0.0
    return state, {f"train/{k}": v for k, v in metrics.items()}


def turn_lengths(conv) -> list[int]:
    """Tokens of each model turn of a conversation (the runs of its assistant mask)."""
    out, run = [], 0
    for m in list(conv.assistant_mask) + [0]:
        if m:
            run += 1
        elif run:
            out.append(run)
            run = 0
    return out


def shaped_rewards(episodes: Sequence[Episode], algo, max_new_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(reward + DAPO's overlong penalty, the penalty) per episode. The penalty counts the
    longest model turn against the per-turn budget `max_new_tokens` (the length a turn is cut
    at); the buffer is capped at that budget so short-turn configs keep a valid shaping."""
    rewards = np.asarray([e.reward for e in episodes], np.float64)
    if not algo.overlong_buffer:
        return rewards, np.zeros_like(rewards)
    longest = [max((n for c in e.training_rows() for n in turn_lengths(c)), default=0) for e in episodes]
    penalty = dapo.overlong_penalty(longest, max_new_tokens, min(algo.overlong_buffer, max_new_tokens),
                                    algo.overlong_factor)
    return rewards + penalty, penalty
