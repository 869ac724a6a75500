"""Calibrate the world-model reward for an embedder on real transitions of *training* games.

    ALFWORLD_DATA=/path/to/alfworld python launch/rwml_calibrate.py --env alfworld --tasks 40 [--json]

    python launch/rwml_calibrate.py --env tau2 --tasks 60 --steps 20 [--json]

Collects triples with the scripted explorer (expert step or random admissible command; tau2,
without a user model: the gold calls or a probe call of another tool, telecom solo), then
for the `embedding` reward (the paper's: distance only) and the `embedding_facts` reward (the
facts must match too): tau_d for the RL reward (best balanced accuracy of paraphrases against
near misses and other states) and for the difficulty filter (the distance within which 0.9 of
paraphrases fall), and at the reward's tau_d the pass rates of true next states
(paraphrases), of near misses (a flipped state, an item dropped or added, a wrong object
number or receptacle, another action's outcome; tau2: a changed value, id or status), and
the action-echo template's mean reward. `--json` prints one object per reward.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def collect(args):
    import numpy as np

    from jaxscaffold.envs import registry
    from jaxscaffold.envs.pool import EnvPool
    from jaxscaffold.train.workloads.world_model import explorer_trajectories
    from jaxscaffold.worldmodel import triples as triples_lib

    tasks = registry.catalogue(args.env, args.split)
    if not tasks:
        raise ValueError(f"{args.env} {args.split}: no tasks")
    order = np.random.default_rng(args.seed).permutation(len(tasks))[: args.tasks]
    with EnvPool(args.workers) as pool:
        episodes = explorer_trajectories(pool, [tasks[i] for i in order], rollouts_per_task=1,
                                         max_steps=args.steps, gold_prob=0.5, seed=args.seed)
    # an empty next state (tau2's `done`) is never a triple (world_model.prepare_data drops it too)
    return [t for t in triples_lib.dedupe(t for e in episodes for t in triples_lib.from_trajectory(
        e.task.env, e.task.task_id, e.observations, e.actions)) if t.next_state.strip()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="alfworld", help="alfworld | tau2")
    p.add_argument("--split", default="train", help="training games (the evaluation splits stay unseen)")
    p.add_argument("--tasks", type=int, default=40)
    p.add_argument("--steps", type=int, default=15, help="explorer steps per episode")
    p.add_argument("--embedder", default="minilm", help="minilm | qwen3")
    p.add_argument("--embedder-path", default="")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    from jaxscaffold.worldmodel import calibration
    from jaxscaffold.worldmodel.embedders import make_embedder

    try:
        triples = collect(args)
        embedder = make_embedder(args.embedder, args.embedder_path)
    except (KeyError, ValueError, OSError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"{len(triples)} distinct triples ({args.env} {args.split}, {args.tasks} tasks), embedder {args.embedder}")
    for facts in (False, True):
        r = calibration.report(embedder, triples, seed=args.seed, facts=facts)
        name = "embedding_facts" if facts else "embedding"
        print(f"{name:>16}: tau_d {r['tau_d']:.2f} (filter {r['filter_tau_d']:.2f}), balanced accuracy "
              f"{r['balanced_accuracy']:.3f}; pass rates: true states {r['positive_pass_rate']:.2f}, near misses "
              f"{r['near_miss_pass_rate']:.2f}; action-echo reward {r['action_echo_reward']:.2f}")
        for kind, rate in r["near_miss_pass_rate_by_kind"].items():
            print(f"{'':>18}{kind:<14} {rate:.2f} of {r['near_misses'][kind]}")
        if args.json:
            print(json.dumps({"env": args.env, "split": args.split, "embedder": args.embedder, "reward": name,
                              "triples": len(triples), **r}))


if __name__ == "__main__":
    main()
