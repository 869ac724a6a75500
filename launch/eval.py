"""Evaluates a policy on a benchmark split, or on a config's evaluation set, through the same
code path training uses.

  python launch/eval.py --env sciworld --split L0/test --policy gold --limit 20 [--json]
  python launch/eval.py --env letters --split test --policy model --checkpoint runs/tiny
  python launch/eval.py --config fee.py --list-tasks --json
  python launch/eval.py --config fee.py --config.eval.tasks=8 --policy gold

`--policy gold` plays the benchmark's own gold / expert path through the agent's interface
(the environment pool and adapters), a sanity check; `--policy model` evaluates a training
checkpoint (or `--hf DIR`) greedily in the standard environment, as training-time evaluation
does. Each episode gets a line (task, category, reward, steps, outcome or failure reason);
`--out FILE` writes every episode as a JSON line with its whole trajectory (the env's
observations, the actions it read, the feedback given, and for the model the decoded
conversation). Infrastructure failures (a crashed or hung env) are counted and shown, never
scored. `--json` adds a final JSON line with env, split, episodes, failures and success_rate.
ScienceWorld levels are part of the split: `--split L1/test`.

`--config NAME_OR_PATH` (with `--config.FIELD=VALUE` overrides) takes the config's evaluation
set instead of --env / --split: `envs.eval`, capped at `eval.tasks`, balanced over each env's
categories with the run seed, as training evaluates (`train.tasks.load_eval_tasks`); it reports
the paper's scores (per env, per category, per tag: BFCL's difficulty tiers
`eval/success_bfcl/tier_easy|medium|hard`; `eval/score`; the JSON line's "metrics").
`--list-tasks` prints the set, one task a line (env, task_id, category and its tags; with
--json one JSON object each: env, task_id, category), and exits. The overrides also set how the model is run (sampling
`rollout.temperature`, turns `eval.max_turns`, lengths `rollout.max_new_tokens` /
`eval.max_len`, thinking `rollout.enable_thinking`, env options `envs.env_kwargs`, tau2's user
simulator `envs.tau2_user`); with `--checkpoint` they apply to the checkpoint's own config.
tau2 with the model policy needs its user (a config naming none is refused in one line), e.g.
`--config rwml_policy_tau2.py --hf DIR --config.envs.tau2_user.hf_path=USER_DIR --policy model`;
the gold policy replays without one. An env evaluated on several splits is also reported per
split: `--config rwml_policy.py` gives `eval/success_alfworld/valid_seen` (in-distribution)
and `.../valid_unseen` (out-of-distribution).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def fail(message: str) -> None:
    """Bad input: one line on stderr, exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def config_tasks(cfg) -> list:
    """The evaluation set of a run config, as `EnvWorkload` builds it."""
    from jaxscaffold import seeds
    from jaxscaffold.train.tasks import load_eval_tasks
    return load_eval_tasks(cfg.envs.eval, cfg.envs.eval_split, cfg.eval.tasks, seeds.derive(cfg.seed, "eval_tasks"))


def record(ep, tokenizer=None) -> dict:
    """An episode as `--out` writes it (and `train.evaluation.score_metrics` reads it)."""
    out = {"env": ep.task.env, "task_id": ep.task.task_id, "split": ep.task.split, "category": ep.task.category,
           "tags": list(ep.task.tags), "reward": float(ep.reward), "won": bool(ep.won and ep.failure is None), "failed": ep.failure is not None,
           "failure": ep.failure, "end_reason": ep.end_reason, "steps": ep.steps, "truncated": ep.truncated,
           "observations": list(ep.observations), "actions": list(ep.actions),
           "feedback": [list(f) for f in ep.feedback]}
    if tokenizer is not None and len(ep.conversation):
        out["conversation"] = tokenizer.decode(ep.conversation.ids)
    return out


def lost_because(r: dict) -> str:
    """Why an episode was lost: the env's own reason, else out of turns, else its last words."""
    if r.get("end_reason"):
        return r["end_reason"]
    if r["truncated"]:
        return "out of turns"
    last = next((o for o in reversed(r["observations"]) if o.strip()), "")
    last = " ".join(last.split())
    return f"ended without a win; last observation: {last[:120]!r}" if last else "ended without a win"


def episode_line(r: dict) -> str:
    result = (f"FAILED ({r['failure']})" if r["failed"] else "won" if r["won"]
              else f"lost ({lost_because(r)})")
    category = f" [{r['category']}]" if r["category"] else ""
    return f"{r['env']} {r['task_id']}{category}: reward {r['reward']:.3f}, {r['steps']} steps, {result}"


def run_gold(tasks, workers: int) -> list[dict]:
    """The gold policy's episode `record`s."""
    from jaxscaffold.envs.gold import GOLD_ENV_KWARGS
    from jaxscaffold.envs.pool import EnvPool
    from jaxscaffold.episodes.agents import GoldAgent
    from jaxscaffold.episodes.driver import run_episodes
    from jaxscaffold.feedback import enrichers
    records = []
    # With feedback's env hooks, as in training: the gold replay is enriched like the agent.
    with EnvPool(workers, env_kwargs=enrichers.env_kwargs(GOLD_ENV_KWARGS)) as pool:
        # Asynchronous: every task in one call, each episode on its own, 4 per worker holding an env at once.
        records += [record(ep) for ep in run_episodes(GoldAgent(), pool, tasks, max_turns=200, max_live=4 * workers)]
    return records


def checkpoint_config(args, overrides: list[str]):
    """A checkpoint's run config with the command line's `--config.` overrides applied."""
    from jaxscaffold import config as config_lib
    from jaxscaffold.train.checkpoint import Checkpointer, find_params
    directory, step = find_params(args.checkpoint)  # the newest full or params-only checkpoint
    ckpt = Checkpointer(directory, async_save=False)
    saved = config_lib.saved(ckpt.restore_extra(step)["config"])
    return (ckpt, step), config_lib.from_configdict(config_lib.parse_overrides(saved, overrides))


def run_model(args, tasks, base=None, overrides: list[str] = ()) -> list[dict]:
    """The greedy model's episode `record`s; `base`: the --config's run config (its envs, and
    its model unless --checkpoint or --hf names one)."""
    from jaxscaffold import config as config_lib
    from jaxscaffold.train.job import build_job
    from jaxscaffold.train.workloads.env_rl import EnvWorkload
    ckpt = None
    if args.checkpoint:
        ckpt, cfg = checkpoint_config(args, list(overrides))
    else:
        cfg = base or config_lib.from_configdict(config_lib.load_file(os.path.join(ROOT, "configs", "base.py")))
        if args.hf:
            cfg = config_lib.replace(cfg, **{"model.hf_path": args.hf})
    spec, split = (base.envs.eval, base.envs.eval_split) if base is not None else (args.env, args.split)
    cfg = config_lib.replace(cfg, **{"envs.eval": spec, "envs.eval_split": split, "eval.tasks": len(tasks),
                                     "envs.train": spec, "envs.train_split": split,
                                     "envs.num_workers": args.workers})
    job, state = build_job(cfg)
    params = state.params
    if ckpt is not None:  # the parameters alone (the optimizer state is never read)
        reader, step = ckpt
        params = reader.read_params(params, step)
        reader.close()
    work = EnvWorkload(job)
    try:
        episodes = work.evaluate_episodes(job, params, step=0, tasks=tasks)
    finally:
        work.close()
    return [record(e, job.tokenizer) for e in episodes]


def main(argv: list[str] | None = None) -> None:
    from jaxscaffold import config as config_lib
    try:
        base, rest, show_help = config_lib.from_command_line(sys.argv[1:] if argv is None else argv,
                                                             os.path.join(ROOT, "configs"))
        if base is not None:
            from jaxscaffold.train.config_checks import check
            check(base)
    except config_lib.ConfigError as e:
        fail(str(e))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="a config (name in configs/ or path): its evaluation set (and model)")
    p.add_argument("--env", help="a benchmark (instead of --config)")
    p.add_argument("--split", help="its split")
    p.add_argument("--list-tasks", action="store_true", help="print the evaluation set and exit")
    p.add_argument("--policy", choices=("gold", "model"), default="gold")
    p.add_argument("--checkpoint", default="", help="a training run's out_dir (policy model: its newest full or params-only checkpoint)")
    p.add_argument("--hf", default="", help="an HF model directory (policy model)")
    p.add_argument("--limit", type=int, default=None, help="first N tasks of the split")
    p.add_argument("--workers", type=int, default=2, help="environment worker processes")
    p.add_argument("--out", default="", help="write every episode with its trajectory as JSON lines")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(rest + (["--help"] if show_help else []))
    args.config = config_lib.config_name(sys.argv[1:] if argv is None else argv)
    if base is None and not (args.env and args.split):
        fail("give --config NAME_OR_PATH, or --env and --split")
    if base is not None and (args.env or args.split or args.limit):
        fail("--config brings its evaluation set: --env, --split and --limit go without it")
    from jaxscaffold.envs import registry
    try:
        if base is not None:
            tasks = config_tasks(base)
        else:
            tasks = registry.catalogue(args.env, args.split)
            tasks = tasks[: args.limit] if args.limit else tasks
    except (KeyError, FileNotFoundError, ValueError, ImportError) as e:
        fail(str(e).strip("'\""))
    if args.list_tasks:
        for t in tasks:
            print(json.dumps({"env": t.env, "task_id": t.task_id, "category": t.category}) if args.json
                  else "\t".join([t.env, t.task_id, t.category, *t.tags]))
        return
    if args.policy == "model" and not (args.checkpoint or args.hf or base is not None and base.model.hf_path):
        fail("--policy model needs --checkpoint or --hf (or a --config with model.hf_path)")
    overrides = [a[len("--config."):] for a in (sys.argv[1:] if argv is None else argv) if a.startswith("--config.")]
    from jaxscaffold.train.checkpoint import CheckpointNotFound
    from tpu_train import user_errors  # launch/, this script's folder: one list of bad-input errors
    try:
        results = (run_gold(tasks, args.workers) if args.policy == "gold"
                   else run_model(args, tasks, base, overrides))
    except (CheckpointNotFound, *user_errors()) as e:  # a missing model or checkpoint, a bad override
        fail(str(e))
    for r in results:
        print(episode_line(r))
    if args.out:
        with open(args.out, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    won = [r["won"] for r in results if not r["failed"]]
    failures = sum(r["failed"] for r in results)
    rate = sum(won) / max(len(won), 1)
    name = f"{args.env} {args.split}" if base is None else f"{args.config} evaluation set"
    print(f"{name}: {args.policy} policy won {sum(won)}/{len(won)} episodes ({rate:.1%})"
          + (f"; {failures} infrastructure failures, not scored" if failures else ""))
    report = {"env": args.env, "split": args.split} if base is None else {"config": args.config}
    report.update({"episodes": len(won), "failures": failures, "success_rate": rate})
    if base is not None:
        from jaxscaffold.train.evaluation import score_metrics
        report["metrics"] = score_metrics(results)
        for k, v in report["metrics"].items():
            print(f"  {k} {v:.3f}")
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
