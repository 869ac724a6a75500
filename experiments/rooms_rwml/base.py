"""The base of the rooms RWML study: `python experiments/rooms_rwml/base.py ROOMS_BASE OUT_DIR [--warmup-steps N]`.

From experiments/rooms_fee/base.py's model (supervised on its hint-following teacher, `rooms` words), two steps:
1. the `rooms_wm` vocabulary (`vocab_transfer` beside it: learned rows kept, RWML's
   words, `<next_state>` among them, freshly initialised);
2. a format warm-up (N supervised steps, default 4,000 of batch 16 at lr 2e-3, ~18 min here; the
   package's trainer runs it as an `sft` job fed by `WarmUp`, in OUT_DIR/run), each
   batch a mix: `--policy-share` of its rows are the rooms base's own training examples (step-wise
   rows of its teacher on the train split, experiments/rooms_fee/base.py's `teacher_batch` with its
   `TEACHER`), the rest explorer triples of `--copy-tasks` train layouts (default all 512: ~5,700
   triples) answered `<next_state>CURRENT STATE</next_state>`, i.e. the identity world model.
   Why so many: 500 steps on 268 triples of 24 layouts taught the format and a *memorised* state
   (0 of 32 held-out copies exact); 4,000 on all layouts copy 11 of 32 exactly
   (experiments/rooms_rwml/observed.md).
Why 2: the paper's base is an instruct model that writes a requested answer format; ours has
never seen `<next_state>`, so every world-model answer would be unparsable and RWML's GRPO
would get no signal at all. Copying the current state teaches the format and nothing of the
dynamics (it is right only where the action changes nothing: `look`, ~18% of triples), so
stage 1 starts with some reward to improve on. The policy rows are why the mix: copy targets
alone (30 steps at lr 1e-3) moved the policy's first answer token from `look` to `The` and its
entropy from 1.5 to 4.9 nats, so no arm could act (experiments/rooms_rwml/observed.md).
At the end the script prints a check on held-out (test split) prompts: the share of parsable
`<next_state>` answers, greedy and sampled, and on policy prompts the first-token entropy and
the greedy valid-action rate (`--warmup-steps 0` gives the moved rooms base's figures).
`--targets next` answers the world-model rows with the true next state instead (a WM-SFT
warm-up: not the study's base, whose arms would then all start from WM-SFT), and
`--params-every N` keeps the parameters every N steps: experiments/rooms_rwml/premise.py reads
them to measure RWML's premise along one build (docs/studies/rwml_premise.md).
Every arm of experiments/rooms_rwml/study.py, policy RL alone included, starts from OUT_DIR
(`model.hf_path`, `model.vocabulary=rooms_wm`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def copy_triples(cfg, split: str, tasks: int, seed: int, *, copy: bool = True):
    """Explorer triples of `tasks` tasks of `split` whose target is the current state (with
    `copy=False`: the true next state, as stage 1 scores it)."""
    from jaxscaffold.train.envs import make_envs
    from jaxscaffold.train.tasks import load_tasks
    from jaxscaffold.train.workloads.world_model import explorer_trajectories
    from jaxscaffold.worldmodel import triples as triples_lib

    picked = load_tasks(cfg.envs.train, split)[-tasks:]
    envs = make_envs(cfg, {"rooms"})
    try:
        episodes = explorer_trajectories(envs, picked, rollouts_per_task=1, max_steps=cfg.rwml.collect_max_turns,
                                         gold_prob=cfg.rwml.explore_gold_prob, seed=seed)
    finally:
        envs.close()
    triples = triples_lib.dedupe(t for e in episodes for t in triples_lib.from_trajectory(
        e.task.env, e.task.task_id, e.observations, e.actions))
    return [dataclasses.replace(t, next_state=t.observation) for t in triples] if copy else triples


@functools.lru_cache(maxsize=None)
def rooms_base_module():
    """experiments/rooms_fee/base.py as a module (its public `teacher_batch` and `TEACHER`: the base's own
    examples), loaded once."""
    spec = importlib.util.spec_from_file_location("rooms_base", os.path.join(ROOT, "experiments", "rooms_fee", "base.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mixed_batch(chat, triples, pcfg, env, tasks, rng: random.Random, *, batch: int, policy_share: float,
                turns: int = 14):
    """`batch` conversations: round(batch * policy_share) step-wise rows of the rooms base's
    teacher (loss on the action, as the base and stage 2, configs/rooms.py's
    `rollout.representation=stepwise`, see a turn), the rest world-model prompts answered with
    the triple's `next_state` (here the current state)."""
    from jaxscaffold.train.workloads.world_model import answered_conversation

    base = rooms_base_module()
    n_policy = round(batch * policy_share)
    convs = base.teacher_batch(env, tasks, chat, rng, n_policy, turns, **base.TEACHER)
    convs += [answered_conversation(chat, rng.choice(triples), pcfg) for _ in range(batch - n_policy)]
    return convs


class WarmUp:
    """The warm-up's mixed batches (`mixed_batch`) as the `sft` workload's demonstrations
    (`workloads.sft.Demonstrations`), from one generator seeded once."""

    def __init__(self, chat, triples, pcfg, *, batch: int, policy_share: float, seed: int):
        from jaxscaffold.envs import rooms

        self.chat, self.triples, self.pcfg, self.size, self.share = chat, triples, pcfg, batch, policy_share
        self.env, self.tasks, self.rng = rooms.RoomsEnv(), rooms.catalogue("train"), random.Random(seed)

    def batch(self, step: int):
        from jaxscaffold.envs.base import Task

        convs = mixed_batch(self.chat, self.triples, self.pcfg, self.env, self.tasks, self.rng, batch=self.size,
                            policy_share=self.share)
        return [(Task("rooms", "warm-up", "train"), conv) for conv in convs]

    def get_state(self) -> dict:
        return {"rng": rooms_base_module().rng_state(self.rng)}

    def set_state(self, state: dict) -> None:
        rooms_base_module().restore_rng(self.rng, state["rng"])


def warm_up_overrides(out_dir: str, *, steps: int, lr: float, params_every: int = 0) -> list[str]:
    """The stage-1 config turned into the warm-up's `sft` job: `steps` steps of constant-lr AdamW
    without decay from the model in out_dir, no evaluation, the result exported over it (the
    run itself in out_dir/run; with `params_every`, its parameters also kept every N steps in
    out_dir/run/params, all of them, for a curve along one build: experiments/rooms_rwml/premise.py)."""
    return ["job=sft", f"steps={steps}", f"rl.lr={lr}", "rl.weight_decay=0.0", "rl.warmup_steps=0",
            "rl.lr_schedule=constant", "eval.every=0", f"out_dir={os.path.join(out_dir, 'run')}",
            f"checkpoint.every={steps}", f"checkpoint.params_only_every={params_every}",
            "checkpoint.params_only_keep=0", "export.at_end=True", f"export.dir={out_dir}"]


def warm_up(cfg, triples, *, batch: int, policy_share: float, seed: int):
    """The warm-up (`cfg`: `warm_up_overrides`' job) through the package's trainer, its
    batches the `WarmUp` source's."""
    from jaxscaffold.models.chat import Qwen3ChatRenderer
    from jaxscaffold.train.trainer import train
    from jaxscaffold.train.vocabularies import word_tokenizer
    from jaxscaffold.train.workloads.sft import SFTWorkload
    from jaxscaffold.train.workloads.world_model import prompt_config

    source = WarmUp(Qwen3ChatRenderer(word_tokenizer(cfg.model.vocabulary)), triples, prompt_config(cfg),
                    batch=batch, policy_share=policy_share, seed=seed)
    return train(cfg, workload=lambda job, params: SFTWorkload(job, params, demonstrations=source))


def policy_prompts(chat, n: int, seed: int):
    """(prompt ids, valid actions) of n test-split observations, each after 0-3 random valid steps,
    as a step-wise row shows them (the task's first observation and the current one)."""
    from jaxscaffold.envs import rooms
    from jaxscaffold.envs.prompts import history_window_text, system_prompt

    env, tasks, rng = rooms.RoomsEnv(), rooms.catalogue("test"), random.Random(seed)
    out = []
    for task in tasks[:n]:
        obs = env.reset(task)
        first, step = obs.text, 0
        for _ in range(rng.randint(0, 3)):
            result = env.step(rng.choice(obs.privileged["valid_actions"]))
            if result.done:
                break
            obs, step = result.observation, step + 1
        user = history_window_text(first, [], obs.text, step)
        ids = chat.render([{"role": "system", "content": system_prompt("rooms")},
                           {"role": "user", "content": user}], add_generation_prompt=True, enable_thinking=False)
        out.append((ids, list(obs.privileged["valid_actions"])))
    return out


def answer_body(text: str) -> str:
    return text.split("</think>")[-1].strip()


def check(job, params, heldout, *, seed: int) -> dict:
    """Held-out figures: parsable `<next_state>` shares, the parsed answers' mean line distance to
    their copy targets and the share exact (greedy, 2 samples a triple), and on
    policy prompts the first-token entropy (nats), its modal token and the greedy valid-action rate."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxscaffold.episodes.driver import complete
    from jaxscaffold.models import qwen3
    from jaxscaffold.models.chat import Qwen3ChatRenderer
    from jaxscaffold.train.workloads.world_model import sample_answers
    from jaxscaffold.worldmodel.line_reward import line_rewards_with_counts
    from jaxscaffold.worldmodel.reward import MAX_DISTANCE

    out = {}
    for name, greedy, k in (("greedy", True, 1), ("sampled", False, 2)):
        answers = sample_answers(job, params, heldout, samples=k, seed=seed, greedy=greedy)
        # The copy's fidelity (the targets are the current states), scored as stage 1 scores it:
        # RWML's `lines` reward needs exact lines, and a plausible state of another layout earns none.
        targets = [t.next_state for t in heldout for _ in range(k)]
        exact, distances, _ = line_rewards_with_counts([t for _, t in answers], targets, tau_d=1e-9)
        parsed = distances < MAX_DISTANCE
        out[f"wm_parsed_{name}"] = float(np.mean(parsed))
        out[f"wm_copy_distance_{name}"] = float(np.mean(distances[parsed])) if parsed.any() else MAX_DISTANCE
        out[f"wm_copy_exact_{name}"] = float(np.mean(exact))
        out[f"wm_example_{name}"] = answers[0][1][:80]
    chat = Qwen3ChatRenderer(job.tokenizer)
    prompts = policy_prompts(chat, 32, seed)
    width = max(len(p) for p, _ in prompts)
    tokens = np.zeros((len(prompts), width), np.int32)
    for r, (p, _) in enumerate(prompts):
        tokens[r, :len(p)] = p  # right padding: no effect on earlier positions
    logits = qwen3.forward(params, job.model_config, jnp.asarray(tokens))
    last = np.asarray(jax.device_get(logits))[np.arange(len(prompts)), [len(p) - 1 for p, _ in prompts]]
    logp = jax.nn.log_softmax(jnp.asarray(last, jnp.float32), axis=-1)
    out["policy_first_token_entropy"] = float(jnp.mean(-jnp.sum(jnp.exp(logp) * logp, axis=-1)))
    modal = np.bincount(np.asarray(jnp.argmax(logp, axis=-1))).argmax()
    out["policy_first_token"] = job.tokenizer.decode([int(modal)])
    acted = complete(params, job.eval_sampler, job.tokenizer, [p for p, _ in prompts], max_new_tokens=16, seed=seed)
    out["policy_valid_action_rate"] = float(np.mean([answer_body(t) in valid
                                                     for (_, t), (_, valid) in zip(acted, prompts)]))
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("rooms_base")
    p.add_argument("out_dir")
    p.add_argument("--warmup-steps", type=int, default=4000, help="format warm-up steps (0: only the vocabulary)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--policy-share", type=float, default=0.5, help="share of each batch that is policy episodes")
    p.add_argument("--copy-tasks", type=int, default=512,
                   help="train layouts the copy triples come from (the last N; 512: all of them)")
    p.add_argument("--targets", choices=("copy", "next"), default="copy",
                   help="the world-model rows' answers: the current state (copy, the study's base: no dynamics "
                        "taught) or the true next state (next: a WM-SFT warm-up, for experiments/rooms_rwml/premise.py)")
    p.add_argument("--params-every", type=int, default=0,
                   help="also keep the parameters every N warm-up steps (out_dir/run/params; 0: only the end)")
    p.add_argument("--no-check", action="store_true", help="skip the held-out check at the end")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if (args.warmup_steps < 0 or args.batch < 1 or not args.lr > 0 or not 0 <= args.policy_share < 1
            or args.copy_tasks < 1 or args.params_every < 0):
        print("error: --warmup-steps must be >= 0, --batch >= 1, --lr > 0, --policy-share in [0, 1), "
              "--copy-tasks >= 1 and --params-every >= 0",
              file=sys.stderr)
        return 2

    from jaxscaffold import config as config_lib
    from experiments.rooms_rwml import vocab_transfer
    from jaxscaffold.models import hf_io
    from jaxscaffold.train.job import build_job
    from jaxscaffold.train.vocabularies import word_tokenizer

    try:
        config, params = hf_io.load_pretrained(args.rooms_base)
        config, params = vocab_transfer.transfer(config, params, word_tokenizer("rooms"), word_tokenizer("rooms_wm"),
                                                 seed=args.seed)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tokens = hf_io.SpecialTokens.of(word_tokenizer("rooms_wm"))
    hf_io.save_pretrained(args.out_dir, config, params, tokens=tokens)
    print(f"wrote {args.out_dir} on rooms_wm ({config.vocab_size} rows)", flush=True)
    if args.warmup_steps == 0 and args.no_check:
        return 0
    cd = config_lib.load_file(config_lib.config_path("rwml_rooms.py", os.path.join(ROOT, "configs")))
    stage1 = [f"model.hf_path={args.out_dir}", f"seed={args.seed}", "mesh.devices=1"]
    cfg = config_lib.from_configdict(config_lib.parse_overrides(cd, stage1))
    if args.warmup_steps:
        triples = copy_triples(cfg, "train", args.copy_tasks, args.seed, copy=args.targets == "copy")
        overrides = warm_up_overrides(args.out_dir, steps=args.warmup_steps, lr=args.lr, params_every=args.params_every)
        warm_up(config_lib.from_configdict(config_lib.parse_overrides(cd, stage1 + overrides)), triples,
                batch=args.batch, policy_share=args.policy_share, seed=args.seed)
        print(f"wrote {args.out_dir}: {args.warmup_steps} warm-up steps ({args.policy_share:.0%} policy rows) "
              f"on {len(triples)} {args.targets} triples", flush=True)
    if not args.no_check:
        job, state = build_job(cfg)  # the model as written to out_dir
        heldout = copy_triples(cfg, "test", 8, args.seed + 1)[:32]
        print("check " + json.dumps(check(job, state.params, heldout, seed=args.seed)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
