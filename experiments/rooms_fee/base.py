"""A base model for the rooms testbed: `python experiments/rooms_fee/base.py OUT_DIR [--steps N] [--hint P]
[--follow P] [--oe P]`.

Why: RL from a random init gets no reward on rooms (a random tiny model writes no valid
action, so every GRPO group is all zeros and nothing learns, with or without feedback). The
paper starts from an instruct model that writes valid actions and reads hints, but does not
plan. This is that stand-in: a from-scratch tiny model on the rooms vocabulary, fitted
(supervised, loss on the action tokens only) to the step-wise rows (one a turn, as
configs/rooms.py's rollout renders them) of 14-turn episodes on the train split of a policy that
  * picks a uniformly random valid (listed) action, except that
  * on a turn whose observation carries an AG hint (the env's `Hint: ...` line, shown with
    probability --hint) it takes the hinted action with probability --follow;
  * an OE checklist is shown on some other turns (--oe) and changes nothing (the base has
    seen its text, not learnt to use it).
So the base writes listed actions and can follow guidance, yet without guidance it is the
random valid-action policy (it wins ~2% of 14-turn episodes): what to do when no hint is shown
is what RL has to learn. The hint and checklist texts are the feedback enrichers' own
(`feedback.enrichers.rooms_ag`, `rooms_oe`). Writes an HF directory (config.json +
safetensors) that a run loads with `model.hf_path=OUT_DIR` and `model.vocabulary=rooms`.

The fit runs through the package's trainer as an `sft` job whose demonstrations the teacher
writes afresh each step (`Teacher`, a `workloads.sft.Demonstrations` source); OUT_DIR/run holds
that run (its config, metrics, final checkpoint and the seeded random init it starts from; the
trainer resumes a finished run rather than redo it, so a new base takes a new OUT_DIR).

The defaults are the base the third FEE study ran from (experiments/rooms_fee/):
copying emerges late. Measured by experiments/rooms_fee/measure.py (64 test layouts at 2,000 steps, 32 at
the others), the share of hinted turns on which the model takes the hint, AG on every step:
0.35 at 500 steps, 0.36 at 1,000, 0.50 at 1,500, 0.92 at 2,000 (success 0.95 with hints on
every step, 0.09 on the first 3 only, 0.02 without; valid actions 0.87). The earlier defaults
(hint 0.3, follow 0.9, 300-600 steps) never got there. 2,000 steps took 44 min on one core of
a shared 2-core machine (at load ~3). That base was trained before the step-wise prompt's
labels joined the rooms vocabulary (they were the unknown id): a base for the current
vocabulary is trained afresh.
"""

from __future__ import annotations

import argparse
import random
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import jax  # noqa: E402

from jaxscaffold import config as config_lib  # noqa: E402
from jaxscaffold.envs import rooms  # noqa: E402
from jaxscaffold.envs.base import Task  # noqa: E402
from jaxscaffold.envs.prompts import history_window_text, system_prompt  # noqa: E402
from jaxscaffold.feedback.enrichers import rooms_ag, rooms_oe  # noqa: E402
from jaxscaffold.models import config as model_configs  # noqa: E402
from jaxscaffold.models import hf_io, qwen3  # noqa: E402
from jaxscaffold.models.chat import Qwen3ChatRenderer  # noqa: E402
from jaxscaffold.models.word_tokenizer import padded_vocab_size  # noqa: E402
from jaxscaffold.rollout.conversation import Conversation  # noqa: E402
from jaxscaffold.train.export import export_checkpoint  # noqa: E402
from jaxscaffold.train.trainer import train  # noqa: E402
from jaxscaffold.train.vocabularies import word_tokenizer  # noqa: E402
from jaxscaffold.train.workloads.sft import SFTWorkload  # noqa: E402


# The teacher of the defaults (the base the third FEE study ran from; experiments/rooms_rwml/base.py's
# policy rows use it too): a hint on half the turns, always taken; an OE checklist on 10%.
TEACHER = {"hint": 0.5, "follow": 1.0, "oe": 0.1}


def shown(obs, actions, rng: random.Random, hint: float, oe: float) -> tuple[str, bool]:
    """(the text the agent sees, whether it carries an AG hint) for one turn."""
    u = rng.random()
    if u < hint and obs.privileged.get("next_walkthrough_action"):
        return rooms_ag(obs, actions), True
    if u < hint + oe:
        return rooms_oe(obs, actions), False
    return obs.text, False


def base_rows(env, task, chat, rng: random.Random, turns: int, *, hint: float, follow: float,
              oe: float, history_window: int = 0) -> list[Conversation]:
    """One episode of the base's teacher policy (module docstring) as the rollout's step-wise
    rows render it (`rollout.representation=stepwise`, configs/rooms.py): one row a turn, the
    prompt rebuilt from the task, the last `history_window` steps and the current observation
    (`envs.prompts.history_window_text`), then the action and <|im_end|> (the loss's tokens)."""
    obs = env.reset(task)
    first, actions, seen, rows = obs.text, [], [], []
    for step in range(turns):
        text, hinted = shown(obs, actions, rng, hint, oe)
        if hinted and rng.random() < follow:
            action = obs.privileged["next_walkthrough_action"]
        else:
            action = rng.choice(obs.privileged["valid_actions"])
        window = list(zip(seen, actions))[-history_window:] if history_window else []
        user = history_window_text(first, window, text, step)
        row = Conversation()
        row.add_context(chat.render([{"role": "system", "content": system_prompt("rooms")},
                                     {"role": "user", "content": user}], add_generation_prompt=True,
                                    enable_thinking=False))
        turn = chat.assistant_completion({"role": "assistant", "content": action}, enable_thinking=False)
        row.ids += turn
        row.assistant_mask += [1] * len(turn)
        row.logprobs += [0.0] * len(turn)
        rows.append(row)
        seen.append(text)
        actions.append(action)
        result = env.step(action)
        if result.done:
            break
        obs = result.observation
    return rows


def teacher_rows(env, tasks, chat, rng: random.Random, n: int, turns: int, *, hint: float, follow: float,
                 oe: float) -> list[tuple[Task, Conversation]]:
    """`n` step-wise teacher rows (`base_rows`) with their tasks, drawn from fresh episodes on
    random `tasks`: an episode's turns are alike for the memoryless teacher, so every row of an
    episode is usable."""
    pool = []
    while len(pool) < n:
        task = rng.choice(tasks)
        pool += [(task, row) for row in base_rows(env, task, chat, rng, turns, hint=hint, follow=follow, oe=oe)]
    return rng.sample(pool, n)


def teacher_batch(env, tasks, chat, rng: random.Random, n: int, turns: int, *, hint: float, follow: float,
                  oe: float) -> list[Conversation]:
    """`teacher_rows` without their tasks."""
    return [row for _, row in teacher_rows(env, tasks, chat, rng, n, turns, hint=hint, follow=follow, oe=oe)]


class Teacher:
    """The teacher's rows as the `sft` workload's demonstrations (`workloads.sft.Demonstrations`):
    `batch` fresh rows of train-split episodes each step, from one generator seeded once."""

    def __init__(self, chat, *, batch: int, turns: int, hint: float, follow: float, oe: float, seed: int):
        self.chat, self.size, self.turns = chat, batch, turns
        self.probs = {"hint": hint, "follow": follow, "oe": oe}
        self.env, self.tasks, self.rng = rooms.RoomsEnv(), rooms.catalogue("train"), random.Random(seed)

    def batch(self, step: int) -> list[tuple[Task, Conversation]]:
        return teacher_rows(self.env, self.tasks, self.chat, self.rng, self.size, self.turns, **self.probs)

    def get_state(self) -> dict:
        return {"rng": rng_state(self.rng)}

    def set_state(self, state: dict) -> None:
        restore_rng(self.rng, state["rng"])


def rng_state(rng: random.Random) -> list:
    """A generator's state as JSON (what a checkpoint keeps)."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def restore_rng(rng: random.Random, state: list) -> None:
    """Sets a generator to `rng_state`'s output."""
    version, internal, gauss = state
    rng.setstate((version, tuple(internal), gauss))


def run_config(args, model_dir: str, run_dir: str):
    """The trainer's `sft` job of a base: the model in `model_dir` on the rooms words, in f32,
    the script's optimizer, no evaluation, the final parameters exported to OUT_DIR."""
    c = config_lib.defaults()
    c.job, c.out_dir, c.steps, c.seed = "sft", run_dir, args.steps, args.seed
    c.model.hf_path, c.model.vocabulary = model_dir, "rooms"
    c.model.param_dtype = c.model.compute_dtype = c.model.cache_dtype = "float32"
    c.model.remat_policy = "none"
    c.rl.lr, c.rl.weight_decay = args.lr, 0.0
    c.rl.lr_schedule = "cosine" if args.cosine else "constant"
    c.envs.train, c.envs.eval, c.envs.num_workers = "rooms", "rooms:test", 0
    c.rollout.max_turns, c.rollout.max_new_tokens, c.rollout.enable_thinking = args.turns, 8, False
    c.eval.every = 0
    c.checkpoint.every, c.checkpoint.params_only_every = min(args.checkpoint_every, args.steps), args.save_every
    c.export.at_end, c.export.dir = True, args.out_dir
    return c


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=64, help="rows (agent turns) per step")
    p.add_argument("--turns", type=int, default=14, help="agent turns of a training episode (rooms.py's max_turns)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--hint", type=float, default=TEACHER["hint"], help="probability a turn shows the AG hint")
    p.add_argument("--follow", type=float, default=TEACHER["follow"], help="probability the hinted action is taken when shown")
    p.add_argument("--oe", type=float, default=TEACHER["oe"], help="probability a turn shows the OE checklist instead")
    p.add_argument("--hidden", type=int, default=64, help="model width (heads of 16; the MLP 3x wider)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--save-every", type=int, default=0, help="also write OUT_DIR/step_N every N steps (0: only the end)")
    p.add_argument("--cosine", action="store_true", help="decay the learning rate to 0 over --steps (else constant)")
    p.add_argument("--init", default="", help="start from this HF directory (an earlier base; its size, not "
                   "--hidden / --layers) instead of a random init")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=50, help="checkpoint the build (weights, optimizer, the "
                   "teacher's generator) every N steps: the same command rerun continues from the last one")
    args = p.parse_args(argv)
    probs_ok = all(0.0 <= x <= 1.0 for x in (args.hint, args.follow, args.oe)) and args.hint + args.oe <= 1.0
    sizes_ok = (args.hidden >= 16 and args.hidden % 16 == 0 and args.layers >= 1 and args.save_every >= 0
                and args.checkpoint_every >= 1)
    if args.steps < 1 or args.batch < 1 or args.turns < 1 or not args.lr > 0 or not probs_ok or not sizes_ok:
        print("error: --steps, --batch and --turns must be >= 1, --lr > 0, --hint/--follow/--oe in [0, 1] "
              "with --hint + --oe <= 1, --hidden a multiple of 16, --layers >= 1, --save-every >= 0, --checkpoint-every >= 1",
              file=sys.stderr)
        return 2

    tok = word_tokenizer("rooms")
    run_dir = os.path.join(args.out_dir, "run")
    model_dir = args.init
    if not args.init:  # a seeded random init of the asked size, where the run starts from
        config = model_configs.tiny(vocab_size=padded_vocab_size(tok), hidden_size=args.hidden,
                                    intermediate_size=3 * args.hidden, num_layers=args.layers,
                                    num_heads=args.hidden // 16, num_kv_heads=max(1, args.hidden // 32),
                                    compute_dtype="float32", remat_policy="none")
        model_dir = os.path.join(run_dir, "init")
        hf_io.save_pretrained(model_dir, config, jax.device_get(qwen3.init_params(config, jax.random.key(args.seed))),
                              tokens=hf_io.SpecialTokens.of(tok))
    teacher = Teacher(Qwen3ChatRenderer(tok), batch=args.batch, turns=args.turns, hint=args.hint, follow=args.follow,
                      oe=args.oe, seed=args.seed)
    train(run_config(args, model_dir, run_dir),
          workload=lambda job, params: SFTWorkload(job, params, demonstrations=teacher))
    for step in range(args.save_every, args.steps, args.save_every) if args.save_every else ():
        export_checkpoint(run_dir, os.path.join(args.out_dir, f"step_{step}"), step=step, verify=False)
    print(f"wrote {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
