"""Calibrate the world-model reward for an embedder on real transitions of *training* games.

    ALFWORLD_DATA=/path/to/alfworld python experiments/calibration/calibrate.py --env alfworld --tasks 40 [--json]

    python experiments/calibration/calibrate.py --env tau2 --tasks 60 --steps 20 [--json]

Collects triples with the scripted explorer (expert step or random admissible command; tau2,
without a user model: the gold calls or a probe call of another tool, telecom solo), then
for the `embedding` reward (the paper's: distance only) and the `embedding_facts` reward (the
facts must match too): tau_d for the RL reward (best balanced accuracy of paraphrases against
near misses and other states) and for the difficulty filter (the distance within which 0.9 of
paraphrases fall), and at the reward's tau_d the pass rates of true next states
(paraphrases), of near misses (a flipped state, an item dropped or added, a wrong object
number or receptacle, another action's outcome; tau2: a changed value, id or status), and
the action-echo template's mean reward. `--json` prints one object per reward.

`--env rooms` (templated states, where `rwml.reward=lines` is the choice) compares the three
rewards at their thresholds (embedding and embedding_facts at --tau-d, lines at 0.01) on
explorer transitions of the train split: the true next state with its lines reordered, the
outcome of every other valid action from the same state (per verb; computed by the env), and
the unchanged current state where the action changed it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


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


def rooms_classes(tasks: int, steps: int, seed: int) -> dict[str, tuple[list[str], list[str]]]:
    """(real next states, counterparts) per class on rooms transitions (see the docstring)."""
    import random

    from jaxscaffold.envs import rooms

    rng = random.Random(seed)
    out: dict[str, tuple[list[str], list[str]]] = {"reordered": ([], []), "current_state": ([], [])}
    for task in rooms.catalogue("train")[:tasks]:
        world, _ = rooms.generate(task.spec["seed"])
        state = rooms.initial_state(world)
        for _ in range(steps):
            actions = rooms.valid_actions(world, state)
            plan = rooms.shortest_plan(world, state) or []
            action = plan[0] if plan and rng.random() < 0.5 else rng.choice(actions)  # the explorer's rule
            nxt = rooms.apply(world, state, action)
            now, truth = rooms.describe(world, state), rooms.describe(world, nxt)
            lines = truth.splitlines()
            out["reordered"][0].append(truth)
            out["reordered"][1].append("\n".join(rng.sample(lines, len(lines))))
            if now != truth:
                out["current_state"][0].append(truth)
                out["current_state"][1].append(now)
            for other in actions:
                text = rooms.describe(world, rooms.apply(world, state, other))
                if text != truth:
                    pair = out.setdefault(f"other_{other.split()[0]}", ([], []))
                    pair[0].append(truth)
                    pair[1].append(text)
            state = nxt
            if rooms.goal_done(world, state):
                break
    return out


def rooms_report(embedder, classes, tau_d: float) -> dict[str, dict[str, float]]:
    """Per class, the pass rate of each reward (embedding, embedding_facts at tau_d; lines at
    0.01) and MiniLM's distance quantiles."""
    import numpy as np

    from jaxscaffold.worldmodel import line_reward, reward

    out = {}
    for name, (truth, other) in classes.items():
        answers = [f"<next_state>{o}</next_state>" for o in other]
        r_emb, d, _ = reward.embedding_rewards_with_counts(embedder, answers, truth, tau_d)
        r_facts, _, _ = reward.embedding_facts_rewards_with_counts(embedder, answers, truth, tau_d)
        r_lines, _, _ = line_reward.line_rewards_with_counts(answers, truth, 0.01)
        out[name] = {"pairs": len(truth), "embedding": float(r_emb.mean()), "embedding_facts": float(r_facts.mean()),
                     "lines": float(r_lines.mean()), "distance_p05": float(np.quantile(d, 0.05)),
                     "distance_median": float(np.median(d)), "distance_p95": float(np.quantile(d, 0.95))}
    return out


def main_rooms(args) -> None:
    from jaxscaffold.worldmodel.embedders import make_embedder

    embedder = make_embedder(args.embedder, args.embedder_path)
    report = rooms_report(embedder, rooms_classes(args.tasks, args.steps, args.seed), args.tau_d)
    print(f"rooms train, {args.tasks} tasks, embedder {args.embedder}: pass rates (embedding / embedding_facts at "
          f"tau_d {args.tau_d}, lines at 0.01) and 1 - cos quantiles")
    for name, r in report.items():
        print(f"  {name:<16} n={r['pairs']:<5} embedding {r['embedding']:.2f}  embedding_facts "
              f"{r['embedding_facts']:.2f}  lines {r['lines']:.2f}   d p05 {r['distance_p05']:.3f} "
              f"median {r['distance_median']:.3f} p95 {r['distance_p95']:.3f}")
    if args.json:
        print(json.dumps({"env": "rooms", "embedder": args.embedder, "tau_d": args.tau_d, "classes": report}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="alfworld", help="alfworld | tau2 | rooms")
    p.add_argument("--split", default="train", help="training games (the evaluation splits stay unseen)")
    p.add_argument("--tasks", type=int, default=40)
    p.add_argument("--steps", type=int, default=15, help="explorer steps per episode")
    p.add_argument("--embedder", default="minilm", help="minilm | qwen3")
    p.add_argument("--embedder-path", default="")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--tau-d", type=float, default=0.14, help="rooms: the embedding rewards' threshold")
    args = p.parse_args()
    if args.env == "rooms":
        main_rooms(args)
        return

    from experiments.calibration import calibration
    from jaxscaffold.worldmodel.embedders import make_embedder

    try:
        triples = collect(args)
        embedder = make_embedder(args.embedder, args.embedder_path)
    except (KeyError, ValueError, OSError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"{len(triples)} distinct triples ({args.env} {args.split}, {args.tasks} tasks), embedder {args.embedder}")
    for name, r in calibration.report(embedder, triples, seed=args.seed).items():
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
