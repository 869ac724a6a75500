"""The policy update of one training step: episodes -> rewards (with DAPO's overlong shaping)
-> group advantages -> (optionally) the trainer's old log-probs -> `ppo_epochs` passes of
mini-batch optimizer steps on the global batch, with the sampler/trainer mismatch measured."""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

from jaxscaffold.models.sharding import shard_batch
from jaxscaffold.rl import dapo
from jaxscaffold.rl.advantages import advantages
from jaxscaffold.rl.train_step import make_old_logprob_step
from jaxscaffold.train.job import Job
from jaxscaffold.train.multihost import allgather_json, process_batch
from jaxscaffold.episodes.episode import Episode


def train_on(job: Job, state, episodes: list[Episode]):
    """Advantages over groups, then ppo_epochs x mini-batches optimizer steps; returns the new
    state and the `train/` metrics, the mean over those steps, except `train/mismatch_*`: the
    sampler/trainer mismatch of the trained tokens before any update (`rl.mismatch`). With
    `rl.recompute_old_logprobs` a forward pass over every mini-batch before the first update
    gives the trainer's old log-probs (the PPO ratio's denominator, and TIS weights with
    `rl.tis_cap`) and measures the mismatch on every row; without it the first optimizer
    step's measurement counts (the whole batch with one mini-batch, else the first mini-batch).

    On several processes `episodes` are this process's (whole groups, so advantages stay
    local); each process feeds its rows and every optimizer step trains on the global batch."""
    ok = [e for e in episodes if e.failure is None and e.training_rows()]
    rewards, penalty = shaped_rewards(ok, job.algo, job.cfg.rollout.max_new_tokens)
    # One row per trajectory, or (step-wise) one per model turn sharing its episode's advantage.
    rows = list(zip((conv for e in ok for conv in e.training_rows()),
                    row_advantages(ok, rewards, job.algo, job.cfg.rl.group_stats)))
    r = job.cfg.rl
    batches = []
    global_rows = sum(allgather_json(len(rows)))  # every process makes as many optimizer steps
    for mb in minibatches(len(rows), r.num_minibatches, r.minibatch_rows, global_rows):
        batch = process_batch([rows[i][0] for i in mb], np.asarray([rows[i][1] for i in mb]), job.row_multiple)
        batches.append(shard_batch(batch, job.mesh) if job.mesh is not None else batch)
    measured = None
    if r.recompute_old_logprobs and batches:
        recompute = make_old_logprob_step(job.model_config, correction=job.algo.correction,
                                          num_micro_batches=r.micro_batches, mesh=job.mesh)
        policy = job.policy_params(state.params)  # LoRA: the base merged with the adapters
        batches, parts = zip(*(recompute(policy, b) for b in batches))  # before any update
        del policy
        measured = combine_mismatch([{k: float(v) for k, v in jax.device_get(p).items()} for p in parts])
    steps = []
    for _ in range(r.ppo_epochs):
        for batch in batches:
            state, m = job.train_step(state, batch, job.frozen)
            steps.append({k: float(v) for k, v in jax.device_get(m).items()})
    metrics = {k: float(np.mean([s[k] for s in steps])) for k in steps[0]} if steps else {}
    if steps:  # the mismatch before any update, not a mean that mixes in the policy's own drift
        metrics.update(measured or {k: v for k, v in steps[0].items() if k.startswith("mismatch_")})
    if job.algo.overlong_buffer:
        metrics["overlong_penalty"] = float(penalty.mean()) if len(penalty) else 0.0
    return state, {f"train/{k}": v for k, v in metrics.items()}


def row_advantages(episodes: Sequence[Episode], rewards: np.ndarray, algo, group_stats: str) -> np.ndarray:
    """One advantage per training row of `episodes` (in their order), every row of an episode
    sharing its reward. `group_stats`: what a group's mean and std count, each trajectory once
    ("trajectory") or every step row ("row", verl-agent's: a long episode weighs more)."""
    counts = [len(e.training_rows()) for e in episodes]
    row_rewards = np.repeat(np.asarray(rewards, np.float64), counts)
    row_groups = np.repeat(np.asarray([e.group for e in episodes]), counts)
    row_episodes = np.repeat(np.arange(len(episodes)), counts)
    return advantages(row_rewards, row_groups, algo, traj_ids_N=row_episodes, count=group_stats)


def minibatches(num_rows: int, num_minibatches: int, minibatch_rows: int = 0,
                global_rows: int | None = None) -> list[np.ndarray]:
    """The row indices of each optimizer step of an epoch: this process's `num_rows` rows, in
    order (verl's actor: `shuffle: False`), in near-equal parts. As many parts as
    `num_minibatches`, or with `minibatch_rows` > 0 as verl's split of the global batch into
    `ppo_mini_batch_size` rows makes: ceil(global_rows / minibatch_rows) (`global_rows`: every
    process's rows, default `num_rows`), near-equal instead of full chunks and a remainder.
    None when the global batch has no row: nothing to train on is no optimizer step (an
    empty step would still move AdamW's moments and apply weight decay)."""
    total = num_rows if global_rows is None else global_rows
    if total == 0:
        return []
    n = -(-total // minibatch_rows) if minibatch_rows > 0 else num_minibatches
    return np.array_split(np.arange(num_rows), n)


def combine_mismatch(parts: Sequence[dict]) -> dict[str, float]:
    """The mismatch of a batch from its mini-batches' (`make_old_logprob_step` metrics): the
    token-weighted KL, the max / min ratio over them."""
    tokens = sum(p["tokens"] for p in parts)
    return {"mismatch_kl": sum(p["mismatch_kl"] * p["tokens"] for p in parts) / max(tokens, 1.0),
            "mismatch_ratio_max": max(p["mismatch_ratio_max"] for p in parts),
            "mismatch_ratio_min": min(p["mismatch_ratio_min"] for p in parts)}


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
