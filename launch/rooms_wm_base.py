"""The base of the rooms RWML study: `python launch/rooms_wm_base.py ROOMS_BASE OUT_DIR [--warmup-steps N]`.

From launch/rooms_base.py's model (random valid-action SFT on the `rooms` words), two steps:
1. the `rooms_wm` vocabulary (`jaxscaffold.models.vocab_transfer`: learned rows kept, RWML's
   words, `<next_state>` among them, freshly initialised);
2. a format warm-up (N supervised steps, default 30): on explorer triples of the *train*
   split, the answer `<next_state>CURRENT STATE</next_state>`, i.e. the identity world model.
Why 2: the paper's base is an instruct model that writes a requested answer format; ours has
never seen `<next_state>`, so every world-model answer would be unparsable and RWML's GRPO
would get no signal at all. Copying the current state teaches the format and nothing of the
dynamics (it is right only where the action changes nothing: `look`, ~18% of triples), so
stage 1 starts with some reward to improve on. Every arm of configs/studies/rwml_rooms.py,
policy RL alone included, starts from OUT_DIR (`model.hf_path`, `model.vocabulary=rooms_wm`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def copy_triples(cfg, seed: int):
    """Explorer triples of cfg's train split whose target is the current state."""
    from jaxscaffold.train.envs import make_envs
    from jaxscaffold.train.tasks import load_tasks
    from jaxscaffold.train.workloads.world_model import explorer_trajectories
    from jaxscaffold.worldmodel import triples as triples_lib

    tasks = load_tasks(cfg.envs.train, cfg.envs.train_split)[-cfg.rwml.collect_tasks:]  # (copies hold no dynamics)
    envs = make_envs(cfg, {"rooms"})
    try:
        episodes = explorer_trajectories(envs, tasks, rollouts_per_task=1, max_steps=cfg.rwml.collect_max_turns,
                                         gold_prob=cfg.rwml.explore_gold_prob, seed=seed)
    finally:
        envs.close()
    triples = triples_lib.dedupe(t for e in episodes for t in triples_lib.from_trajectory(
        e.task.env, e.task.task_id, e.observations, e.actions))
    return [dataclasses.replace(t, next_state=t.observation) for t in triples]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("rooms_base")
    p.add_argument("out_dir")
    p.add_argument("--warmup-steps", type=int, default=30, help="format warm-up steps (0: only the vocabulary)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.warmup_steps < 0 or args.batch < 1 or not args.lr > 0:
        print("error: --warmup-steps must be >= 0, --batch >= 1 and --lr > 0", file=sys.stderr)
        return 2

    from jaxscaffold import config as config_lib
    from jaxscaffold.models import hf_io, vocab_transfer
    from jaxscaffold.train.job import build_job
    from jaxscaffold.train.vocabularies import word_tokenizer
    from jaxscaffold.train.workloads.world_model import sft_on

    try:
        config, params = hf_io.load_pretrained(args.rooms_base)
        config, params = vocab_transfer.transfer(config, params, word_tokenizer("rooms"), word_tokenizer("rooms_wm"),
                                                 seed=args.seed)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    hf_io.save_pretrained(args.out_dir, config, params)
    print(f"wrote {args.out_dir} on rooms_wm ({config.vocab_size} rows)", flush=True)
    if args.warmup_steps == 0:
        return 0
    cd = config_lib.load_file(config_lib.config_path("rwml_rooms.py", os.path.join(ROOT, "configs")))
    cfg = config_lib.from_configdict(config_lib.parse_overrides(
        cd, [f"model.hf_path={args.out_dir}", f"seed={args.seed}", "mesh.devices=1"]))
    job, state = build_job(cfg)
    triples = copy_triples(cfg, args.seed)
    params = sft_on(job, state.params, triples, steps=args.warmup_steps, batch_size=args.batch, lr=args.lr,
                    seed=args.seed)
    hf_io.save_pretrained(args.out_dir, job.model_config, params)
    print(f"wrote {args.out_dir}: {args.warmup_steps} format warm-up steps on {len(triples)} copy triples")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
