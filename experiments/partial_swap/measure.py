"""Partial rollouts' swap (`rollout.partial`): keep the KV cache of the tokens sampled under
the old weights, or re-prefill it under the new ones?

Runs the asynchronous driver on `rooms` with the tiny model (random weights) twice, swapping
at a fixed decode chunk to a perturbed copy of the weights (every array x (1 + eps N(0, 1)):
one version's drift), once keeping the cache and once re-prefilling it
(`ModelAgent(reprefill=True)`), and prints for each way:

- `swap_s`: the swap's seconds (the new weights' layout; re-prefill: plus one prefill of
  every held row's whole history), beside `chunk_s`, a decode chunk's mean seconds;
- `keep_error`: over the tokens sampled after the swap, the mean |recorded log-prob -
  teacher-forced log-prob under the new weights| (re-prefill: numerics only; kept: the old
  cache's share), beside `drift`, the mean |new - old| teacher-forced log-prob of the same
  tokens (what one version changes; the importance correction sees this much anyway).

    python experiments/partial_swap/measure.py --json [--rows 8 --max-new-tokens 24 --chunk 8
        --turns 3 --swap-chunk 4 --eps 0.01]
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxscaffold.envs import registry
from jaxscaffold.envs.local import LocalEnvs
from jaxscaffold.episodes.agents import ModelAgent, RolloutConfig
from jaxscaffold.episodes.driver import run_episodes
from jaxscaffold.models import config as model_config
from jaxscaffold.models import qwen3
from jaxscaffold.models.tokenizer import QwenOfflineTokenizer
from jaxscaffold.rl.logprobs import token_logprobs
from jaxscaffold.rollout.engine import Sampler, SamplerOptions
from jaxscaffold.rollout.sampling import SamplingConfig


class _Timed(ModelAgent):
    """The model agent, counting and timing its decode calls."""

    chunks, chunk_s = 0, 0.0

    def decode(self, turns, chunk):
        t0 = time.perf_counter()
        out = super().decode(turns, chunk)
        self.chunks, self.chunk_s = self.chunks + 1, self.chunk_s + time.perf_counter() - t0
        return out


def measure(rows: int = 8, max_new_tokens: int = 24, chunk: int = 8, turns: int = 3, swap_chunk: int = 4,
            eps: float = 0.01, seed: int = 0) -> dict:
    """{"keep": {...}, "reprefill": {...}} (the module's figures) of one setting."""
    config = model_config.tiny()
    old = qwen3.init_params(config, jax.random.key(seed))
    leaves, tree = jax.tree.flatten(old)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    new = jax.tree.unflatten(tree, [x * (1 + eps * jax.random.normal(k, x.shape, x.dtype)) for x, k in zip(leaves, keys)])
    tok = QwenOfflineTokenizer()
    tasks = [t for t in registry.catalogue("rooms", "train")[:max(1, rows // 2)] for _ in range(2)][:rows]
    teacher = jax.jit(lambda p, ids: token_logprobs(p, config, ids)[0])
    out = {}
    for way in ("keep", "reprefill", "keep", "reprefill"):  # twice: the first run of each compiles
        sampler = Sampler(config, stop_ids=tok.eos_ids, batch_size=rows, max_len=1024,
                          options=SamplerOptions(cache_dtype="float32", sampling=SamplingConfig(temperature=1.0)))
        asks = [0]

        def refresh(asks=asks):
            asks[0] += 1  # once when built, then once before each chunk
            return (old, 0) if asks[0] <= swap_chunk else (new, 1)

        agent = _Timed(old, sampler, tok, RolloutConfig(max_new_tokens=max_new_tokens), seed=seed, train_step=1,
                       refresh_params=refresh, reprefill=way == "reprefill")
        episodes = run_episodes(agent, LocalEnvs({"rooms": registry.factory("rooms")}), tasks, max_turns=turns,
                                decode_chunk=chunk)
        errors, drifts, held = [], [], 0
        for e in episodes:
            conv = e.conversation
            v = conv.arrays()["versions"]
            after = v == 1
            if not after.any():
                continue
            held += 1
            ids = jnp.asarray([conv.ids], jnp.int32)
            lp_new, lp_old = np.asarray(teacher(new, ids)[0]), np.asarray(teacher(old, ids)[0])
            errors.append(np.abs(np.asarray(conv.logprobs)[after] - lp_new[after]))
            drifts.append(np.abs(lp_new[after] - lp_old[after]))
        errors, drifts = np.concatenate(errors), np.concatenate(drifts)
        out[way] = {"swap_s": agent.swap_s, "chunk_s": agent.chunk_s / max(agent.chunks - agent.swaps, 1),
                    "rows_swapped": held, "tokens_after_swap": int(errors.size),
                    "keep_error": float(errors.mean()), "keep_error_max": float(errors.max()),
                    "drift": float(drifts.mean())}
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--chunk", type=int, default=8, help="decode chunk (rollout.decode_chunk)")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--swap-chunk", type=int, default=4, help="decode chunks on the old weights before the swap")
    p.add_argument("--eps", type=float, default=0.01, help="the new version's relative perturbation")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    result = measure(a.rows, a.max_new_tokens, a.chunk, a.turns, a.swap_chunk, a.eps)
    if a.json:
        print(json.dumps(result))
    else:
        for way, r in result.items():
            print(way, " ".join(f"{k}={v:.4g}" for k, v in r.items()))


if __name__ == "__main__":
    main()
