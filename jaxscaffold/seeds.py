"""Named random streams derived from the run seed.

Every random draw of a run comes from one stream, named by what it is for, so two uses of the
run seed never share draws by accident (as `seed + 1000` beside `seed + 7919 * i` could) and a
stream is reproducible on its own from (run seed, name, keys):

    seeds.derive(cfg.seed, "eval")                 # one number for a whole evaluation
    seeds.derive(cfg.seed, "rollout", batch_index)  # one per generation batch

The value is a 32-bit integer: what numpy's `default_rng`, grain's shuffle, `jax.random.key`
and the sampler's per-row seeds accept. Built on numpy's SeedSequence (well-mixed, stable
across numpy versions) with a stable hash of the name (Python's `hash` of a str changes per
process).
"""

from __future__ import annotations

import hashlib

import numpy as np

STREAMS = (
    "init",  # the model's random initial parameters
    "tasks",  # the order of a workload's training task stream
    "rollout",  # training rollouts (sampling, feedback decisions): per generation batch / step
    "eval",  # evaluation rollouts
    "eval_tasks",  # which held-out tasks of each category an evaluation set holds
    "collect_tasks",  # RWML: which tasks are rolled out for triples
    "collect",  # RWML: the policy's rollouts of them, per chunk of rows
    "explore",  # RWML: the scripted explorer's choices
    "heldout",  # RWML: which tasks' triples are held out
    "filter_split",  # RWML difficulty filter: the triples its predictor is fine-tuned on
    "filter_sft",  # ... the predictor's SFT batches
    "filter_samples",  # ... the predictor's K sampled answers
    "filter_keep",  # ... the coins that keep easy triples
    "sft",  # RWML: the WM-SFT baseline's batches
    "lora",  # LoRA: the adapters' initial A matrices
)


def _name_key(stream: str) -> int:
    return int.from_bytes(hashlib.blake2b(stream.encode(), digest_size=4).digest(), "little")


def derive(run_seed: int, stream: str, *keys: int) -> int:
    """The seed of `stream` (one of `STREAMS`) at `keys` (non-negative ints: a step, a batch
    index, a row offset) for the run seed `run_seed`; equal inputs give equal seeds. Trailing
    zero keys do not count (SeedSequence's rule): `derive(s, n)` equals `derive(s, n, 0)`."""
    if stream not in STREAMS:
        raise ValueError(f"unknown seed stream {stream!r}; known: {', '.join(STREAMS)}")
    if any(int(k) < 0 for k in keys):
        raise ValueError(f"seed stream keys must be non-negative, got {keys}")
    seq = np.random.SeedSequence([int(run_seed) & 0xFFFFFFFF, _name_key(stream), *map(int, keys)])
    return int(seq.generate_state(1, np.uint32)[0])


def turn_seed(run_seed: int, train_step: int, episode: int, turn: int) -> int:
    """The sampling seed of one model turn (the sampler's per-row seed): a pure function of its
    coordinates, so an episode samples the same wherever (slot, process, batch) it runs.
    `run_seed` is the stream's seed (e.g. `derive(cfg.seed, "rollout", batch_index)`)."""
    seq = np.random.SeedSequence([run_seed & 0xFFFFFFFF, train_step, episode, turn])
    return int(seq.generate_state(1)[0])
