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
import json
import random
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxscaffold.envs import rooms  # noqa: E402
from jaxscaffold.envs.prompts import history_window_text, system_prompt  # noqa: E402
from jaxscaffold.feedback.enrichers import rooms_ag, rooms_oe  # noqa: E402
from jaxscaffold.models import config as model_configs  # noqa: E402
from jaxscaffold.models import hf_io, qwen3  # noqa: E402
from jaxscaffold.models.chat import Qwen3ChatRenderer  # noqa: E402
from jaxscaffold.models.word_tokenizer import padded_vocab_size  # noqa: E402
from jaxscaffold.rl.train_step import OptimizerConfig, init_train_state, make_sft_step  # noqa: E402
from jaxscaffold.rollout.conversation import Conversation  # noqa: E402
from jaxscaffold.train.batching import build_batch  # noqa: E402
from jaxscaffold.train.vocabularies import word_tokenizer  # noqa: E402


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


def teacher_batch(env, tasks, chat, rng: random.Random, n: int, turns: int, *, hint: float, follow: float,
                  oe: float) -> list[Conversation]:
    """`n` step-wise teacher rows (`base_rows`) drawn from fresh episodes on random `tasks`: an
    episode's turns are alike for the memoryless teacher, so every row of an episode is usable."""
    pool = []
    while len(pool) < n:
        pool += base_rows(env, rng.choice(tasks), chat, rng, turns, hint=hint, follow=follow, oe=oe)
    return rng.sample(pool, n)


def save_resume(out_dir: str, step: int, state, rng: random.Random, args: dict) -> None:
    """The build's state after `step` (the train state's leaves, the teacher's generator, the
    arguments) in OUT_DIR/resume/, written atomically: an interrupted build continues from it
    exactly as if it had not stopped."""
    folder = os.path.join(out_dir, "resume")
    os.makedirs(folder, exist_ok=True)
    leaves = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(state))]
    np.savez(os.path.join(folder, "state.tmp.npz"), *leaves)
    with open(os.path.join(folder, "meta.tmp.json"), "w") as f:
        json.dump({"step": step, "rng": rng.getstate(), "args": args}, f)
    os.replace(os.path.join(folder, "state.tmp.npz"), os.path.join(folder, "state.npz"))
    os.replace(os.path.join(folder, "meta.tmp.json"), os.path.join(folder, "meta.json"))


def load_resume(out_dir: str, state, rng: random.Random, args: dict):
    """(step, state) from OUT_DIR/resume/ when an earlier build of the same arguments left one
    (the generator set to its saved state), else (0, state). A different build's is an error."""
    folder = os.path.join(out_dir, "resume")
    if not os.path.isfile(os.path.join(folder, "meta.json")):
        return 0, state
    with open(os.path.join(folder, "meta.json")) as f:
        meta = json.load(f)
    if meta["args"] != args:
        raise ValueError(f"{folder} holds a build with other arguments ({meta['args']}); remove it to start afresh")
    leaves, treedef = jax.tree.flatten(state)
    with np.load(os.path.join(folder, "state.npz")) as saved:
        loaded = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    if len(loaded) != len(leaves) or any(a.shape != np.shape(b) for a, b in zip(loaded, leaves)):
        raise ValueError(f"{folder}: the saved state does not match this model; remove it to start afresh")
    version, internal, gauss = meta["rng"]
    rng.setstate((version, tuple(internal), gauss))
    return meta["step"], jax.tree.unflatten(treedef, [jax.numpy.asarray(x) for x in loaded])


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
    p.add_argument("--checkpoint-every", type=int, default=50, help="save the build's state to OUT_DIR/resume every "
                   "N steps; a rerun of the same command continues from it (0: never)")
    args = p.parse_args(argv)
    probs_ok = all(0.0 <= x <= 1.0 for x in (args.hint, args.follow, args.oe)) and args.hint + args.oe <= 1.0
    sizes_ok = (args.hidden >= 16 and args.hidden % 16 == 0 and args.layers >= 1 and args.save_every >= 0
                and args.checkpoint_every >= 0)
    if args.steps < 1 or args.batch < 1 or args.turns < 1 or not args.lr > 0 or not probs_ok or not sizes_ok:
        print("error: --steps, --batch and --turns must be >= 1, --lr > 0, --hint/--follow/--oe in [0, 1] "
              "with --hint + --oe <= 1, --hidden a multiple of 16, --layers >= 1, --save-every and --checkpoint-every >= 0",
              file=sys.stderr)
        return 2

    tok = word_tokenizer("rooms")
    chat, tokens = Qwen3ChatRenderer(tok), hf_io.SpecialTokens.of(tok)  # the words' own end ids in the export
    if args.init:
        config, params = hf_io.load_pretrained(args.init, compute_dtype="float32", remat_policy="none")
    else:
        config = model_configs.tiny(vocab_size=padded_vocab_size(tok), hidden_size=args.hidden,
                                    intermediate_size=3 * args.hidden, num_layers=args.layers,
                                    num_heads=args.hidden // 16, num_kv_heads=max(1, args.hidden // 32),
                                    compute_dtype="float32", remat_policy="none")
        params = qwen3.init_params(config, jax.random.key(args.seed))
    opt = OptimizerConfig(lr=args.lr, weight_decay=0.0, schedule="cosine" if args.cosine else "constant",
                          decay_steps=args.steps)
    state = init_train_state(params, opt.make())
    sft_step = make_sft_step(config, opt)
    rng = random.Random(args.seed)
    tasks = rooms.catalogue("train")
    env = rooms.RoomsEnv()
    recipe = {k: v for k, v in vars(args).items() if k not in ("out_dir", "checkpoint_every")}
    try:
        done, state = load_resume(args.out_dir, state, rng, recipe)
    except (ValueError, OSError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if done:
        print(f"continuing from step {done} ({os.path.join(args.out_dir, 'resume')})", flush=True)
    start = time.time()
    for i in range(done + 1, args.steps + 1):
        convs = teacher_batch(env, tasks, chat, rng, args.batch, args.turns, hint=args.hint, follow=args.follow,
                              oe=args.oe)
        state, metrics = sft_step(state, build_batch(convs, np.zeros(len(convs))))
        if i % 50 == 0 or i == args.steps:
            print(f"step {i}/{args.steps}  loss {float(metrics['loss']):.3f}  {time.time() - start:.0f}s", flush=True)
        if args.save_every and i % args.save_every == 0 and i < args.steps:
            hf_io.save_pretrained(os.path.join(args.out_dir, f"step_{i}"), config, jax.device_get(state.params),
                                  tokens=tokens)
        if args.checkpoint_every and i % args.checkpoint_every == 0 and i < args.steps:
            save_resume(args.out_dir, i, state, rng, recipe)
    hf_io.save_pretrained(args.out_dir, config, jax.device_get(state.params), tokens=tokens)
    shutil.rmtree(os.path.join(args.out_dir, "resume"), ignore_errors=True)
    print(f"wrote {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
