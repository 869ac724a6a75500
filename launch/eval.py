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


def run_gold(env: str, tasks, workers: int) -> list[bool]:
    from jaxscaffold.envs.gold import GOLD_ENV_KWARGS, GoldPolicy
    from jaxscaffold.envs.pool import EnvPool, is_failure
    won = []
    with EnvPool(workers, env_kwargs=GOLD_ENV_KWARGS) as pool:
        for start in range(0, len(tasks), 4 * workers):
            chunk = tasks[start:start + 4 * workers]
            obs = pool.reset(chunk)
            policies = {i: GoldPolicy(env, o) for i, o in enumerate(obs) if not is_failure(o)}
            live, result = dict(enumerate(obs)), {i: False for i in range(len(chunk))}
            live = {i: o for i, o in live.items() if i in policies}
            for _ in range(200):
                if not live:
                    break
                out = pool.step({i: policies[i].act(o) for i, o in live.items()})
                live = {}
                for i, r in out.items():
                    if is_failure(r):
                        print(f"infrastructure failure: {r.reason}", file=sys.stderr)
                        continue
                    if r.done:
                        result[i] = bool(r.info.get("won"))
                    else:
                        live[i] = r.observation
            won += [result[i] for i in range(len(chunk))]
    return won


def run_model(args, tasks) -> list[bool]:
    from ml_collections import ConfigDict

    from jaxscaffold.train.checkpoint import Checkpointer
    from jaxscaffold.train.job import build_job
    from jaxscaffold.train.workloads.env_rl import EnvWorkload
    if args.checkpoint:
        ckpt = Checkpointer(os.path.join(args.checkpoint, "checkpoints"), async_save=False)
        cfg = ConfigDict(ckpt.restore_extra()["config"])
    else:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs"))
        import base
        cfg = base.get_config()
        cfg.model.hf_path = args.hf
    cfg.envs.eval, cfg.envs.eval_split, cfg.eval.tasks = args.env, args.split, len(tasks)
    cfg.envs.train, cfg.envs.train_split = args.env, args.split
    cfg.envs.num_workers = args.workers
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
    won = run_gold(args.env, tasks, args.workers) if args.policy == "gold" else run_model(args, tasks)
    rate = sum(won) / max(len(won), 1)
    print(f"{args.env} {args.split}: {args.policy} policy won {sum(won)}/{len(won)} episodes ({rate:.1%})")
    if args.json:
        print(json.dumps({"env": args.env, "split": args.split, "episodes": len(won), "success_rate": rate}))


if __name__ == "__main__":
    main()
