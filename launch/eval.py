"""Evaluates a policy on a benchmark split through the same code path training uses.

  python launch/eval.py --env sciworld --split L0/test --policy gold --limit 20 [--json]
  python launch/eval.py --env letters --split test --policy model --checkpoint runs/tiny

`--policy gold` plays the benchmark's own gold / expert path through the agent's interface
(the environment pool and adapters), a sanity check; `--policy model` evaluates a training
checkpoint (or `--hf DIR`) greedily in the standard environment, as training-time evaluation
does. `--json` adds a final JSON line with env, split, episodes and success_rate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_gold(tasks, workers: int) -> list[bool]:
    """Whether the gold policy won each task (an infrastructure failure counts as a loss)."""
    from jaxscaffold.envs.gold import GOLD_ENV_KWARGS
    from jaxscaffold.envs.pool import EnvPool
    from jaxscaffold.episodes.agents import GoldAgent
    from jaxscaffold.episodes.driver import run_episodes
    from jaxscaffold.feedback import enrichers
    won = []
    # With feedback's env hooks, as in training: the gold replay is enriched like the agent.
    with EnvPool(workers, env_kwargs=enrichers.env_kwargs(GOLD_ENV_KWARGS)) as pool:
        for start in range(0, len(tasks), 4 * workers):
            for ep in run_episodes(GoldAgent(), pool, tasks[start:start + 4 * workers], max_turns=200):
                if ep.failure is not None:
                    print(f"infrastructure failure: {ep.failure}", file=sys.stderr)
                won.append(ep.won and ep.failure is None)
    return won


def run_model(args, tasks) -> list[bool]:
    from jaxscaffold import config as config_lib
    from jaxscaffold.train.checkpoint import Checkpointer
    from jaxscaffold.train.job import build_job
    from jaxscaffold.train.workloads.env_rl import EnvWorkload
    if args.checkpoint:
        ckpt = Checkpointer(os.path.join(args.checkpoint, "checkpoints"), async_save=False)
        cfg = config_lib.from_dict(ckpt.restore_extra()["config"])
    else:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        cfg = config_lib.replace(config_lib.from_configdict(config_lib.load_file(os.path.join(root, "configs", "base.py"))),
                                 **{"model.hf_path": args.hf})
    cfg = config_lib.replace(cfg, **{"envs.eval": args.env, "envs.eval_split": args.split, "eval.tasks": len(tasks),
                                     "envs.train": args.env, "envs.train_split": args.split,
                                     "envs.num_workers": args.workers})
    job, state = build_job(cfg)
    if args.checkpoint:
        state, _ = ckpt.restore(state)
        ckpt.close()
    work = EnvWorkload(job)
    try:
        episodes = work.evaluate_episodes(job, state.params, step=0, tasks=tasks)
    finally:
        work.close()
    return [e.won for e in episodes if e.failure is None]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", required=True)
    p.add_argument("--split", required=True)
    p.add_argument("--policy", choices=("gold", "model"), default="gold")
    p.add_argument("--checkpoint", default="", help="a training run's out_dir (policy model)")
    p.add_argument("--hf", default="", help="an HF model directory (policy model)")
    p.add_argument("--limit", type=int, default=None, help="first N tasks of the split")
    p.add_argument("--workers", type=int, default=2, help="environment worker processes")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    from jaxscaffold.envs import registry
    try:
        tasks = registry.catalogue(args.env, args.split)
    except (KeyError, FileNotFoundError, ValueError, ImportError) as e:
        sys.exit(f"error: {e}")
    tasks = tasks[: args.limit] if args.limit else tasks
    if args.policy == "model" and not (args.checkpoint or args.hf):
        sys.exit("error: --policy model needs --checkpoint or --hf")
    won = run_gold(tasks, args.workers) if args.policy == "gold" else run_model(args, tasks)
    rate = sum(won) / max(len(won), 1)
    print(f"{args.env} {args.split}: {args.policy} policy won {sum(won)}/{len(won)} episodes ({rate:.1%})")
    if args.json:
        print(json.dumps({"env": args.env, "split": args.split, "episodes": len(won), "success_rate": rate}))


if __name__ == "__main__":
    main()
