"""Calibrate the world-model reward's tau_d for an embedder on real ALFWorld transitions.

    ALFWORLD_DATA=/path/to/alfworld python launch/rwml_calibrate.py --split valid_seen --tasks 40 [--json]

Collects triples with the scripted explorer (expert step or random admissible command), then
prints the distance distributions of paraphrased next states (should score 1), other states of
the same game and of other games (should score 0), and the threshold that separates them best.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="alfworld")
    p.add_argument("--split", default="valid_seen")
    p.add_argument("--tasks", type=int, default=40)
    p.add_argument("--steps", type=int, default=15, help="explorer steps per episode")
    p.add_argument("--embedder", default="minilm", help="minilm | qwen3")
    p.add_argument("--embedder-path", default="")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    import numpy as np

    from jaxscaffold.envs import registry
    from jaxscaffold.envs.pool import EnvPool
    from jaxscaffold.train.workloads.world_model import explorer_trajectories
    from jaxscaffold.worldmodel import calibration, triples as triples_lib
    from jaxscaffold.worldmodel.embedders import make_embedder

    try:
        tasks = registry.catalogue(args.env, args.split)
    except (KeyError, FileNotFoundError, ImportError) as e:
        sys.exit(f"error: {e}")
    order = np.random.default_rng(args.seed).permutation(len(tasks))[: args.tasks]
    with EnvPool(args.workers) as pool:
        episodes = explorer_trajectories(pool, [tasks[i] for i in order], rollouts_per_task=1,
                                         max_steps=args.steps, gold_prob=0.5, seed=args.seed)
    unique = triples_lib.dedupe(t for e in episodes for t in triples_lib.from_trajectory(
        e.task.env, e.task.task_id, e.observations, e.actions))
    embedder = make_embedder(args.embedder, args.embedder_path)
    d = calibration.distance_classes(embedder, unique, seed=args.seed)
    tau_same_game, acc_same = calibration.choose_tau(d["paraphrase"], d["same_game"])
    tau_other, acc_other = calibration.choose_tau(d["paraphrase"], np.concatenate([d["same_game"], d["other_game"]]))
    report = {"env": args.env, "split": args.split, "embedder": args.embedder, "triples": len(unique),
              "distances": {k: calibration.summary(v) for k, v in d.items()},
              "tau_d": tau_other, "balanced_accuracy": acc_other,
              "tau_d_vs_same_game": tau_same_game, "balanced_accuracy_vs_same_game": acc_same}
    print(f"{len(unique)} distinct triples from {len(episodes)} episodes ({args.env} {args.split})")
    print(f"{'pairs':<12}{'n':>6}{'p05':>8}{'p25':>8}{'median':>8}{'p75':>8}{'p95':>8}")
    for k, s in report["distances"].items():
        print(f"{k:<12}{int(s['n']):>6}" + "".join(f"{s[q]:>8.3f}" for q in ("p05", "p25", "median", "p75", "p95")))
    print(f"tau_d = {tau_other:.2f} (balanced accuracy {acc_other:.3f}; against same-game states only: "
          f"tau_d = {tau_same_game:.2f}, {acc_same:.3f})")
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
