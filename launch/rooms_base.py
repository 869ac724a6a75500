"""A base model for the rooms testbed: `python launch/rooms_base.py OUT_DIR [--steps N]`.

Why: RL from a random init gets no reward on rooms (a random tiny model writes no valid
action, so every GRPO group is all zeros and nothing learns, with or without feedback). The
paper starts from an instruct model that already writes valid actions but does not plan.
This is that stand-in: a from-scratch tiny model on the rooms vocabulary, fitted (supervised,
loss on the agent's turns only) to episodes of a *uniformly random valid-action* policy on the
train split, with no feedback text. It learns the chat and action format and to pick one of
the listed actions; it learns nothing of which action reaches the goal (the random policy
succeeds in ~2% of 14-turn episodes). Writes an HF directory (config.json + safetensors) that a
run loads with `model.hf_path=OUT_DIR` and `model.vocabulary=rooms`.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from jaxscaffold.envs import rooms  # noqa: E402
from jaxscaffold.envs.prompts import system_prompt  # noqa: E402
from jaxscaffold.models import config as model_configs  # noqa: E402
from jaxscaffold.models import hf_io, qwen3  # noqa: E402
from jaxscaffold.models.chat import Qwen3ChatRenderer  # noqa: E402
from jaxscaffold.models.word_tokenizer import padded_vocab_size  # noqa: E402
from jaxscaffold.train.vocabularies import word_tokenizer  # noqa: E402

BUCKET = 128  # sequence lengths padded to a multiple of this (few compiled shapes)


def random_episode(env, task, chat, rng: random.Random, turns: int) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of one episode of the uniformly random valid-action policy, rendered
    as the rollout renders it (no thinking; each agent turn its action and <|im_end|>)."""
    obs = env.reset(task)
    ids = chat.render([{"role": "system", "content": system_prompt("rooms")},
                       {"role": "user", "content": obs.text}], add_generation_prompt=True, enable_thinking=False)
    mask = [0] * len(ids)
    for _ in range(turns):
        action = rng.choice(obs.privileged["valid_actions"])
        turn = chat.assistant_completion({"role": "assistant", "content": action}, enable_thinking=False)
        ids, mask = ids + turn, mask + [1] * len(turn)
        result = env.step(action)
        if result.done:
            break
        obs = result.observation
        more = chat.continue_with_user(obs.text, enable_thinking=False)
        ids, mask = ids + more, mask + [0] * len(more)
    return ids, mask


def batch(examples) -> tuple[np.ndarray, np.ndarray]:
    t = -(-max(len(i) for i, _ in examples) // BUCKET) * BUCKET
    tokens = np.zeros((len(examples), t), np.int32)
    mask = np.zeros((len(examples), t), np.float32)
    for r, (ids, m) in enumerate(examples):
        tokens[r, :len(ids)], mask[r, :len(m)] = ids, m
    return tokens, mask


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--turns", type=int, default=6, help="agent turns per training episode (the policy is memoryless)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.steps < 1 or args.batch < 1 or args.turns < 1 or not args.lr > 0:
        print("error: --steps, --batch and --turns must be >= 1 and --lr > 0", file=sys.stderr)
        return 2

    tok = word_tokenizer("rooms")
    chat = Qwen3ChatRenderer(tok)
    config = model_configs.tiny(vocab_size=padded_vocab_size(tok), compute_dtype="float32", remat_policy="none")
    params = qwen3.init_params(config, jax.random.key(args.seed))
    opt = optax.adamw(args.lr, weight_decay=0.0)
    opt_state = opt.init(params)

    def loss_fn(params, tokens, mask):
        logits = qwen3.forward(params, config, tokens[:, :-1])  # right padding: no effect on earlier tokens
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        m = mask[:, 1:]
        return jnp.sum(nll * m) / jnp.maximum(jnp.sum(m), 1.0)

    @jax.jit
    def step(params, opt_state, tokens, mask):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, mask)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    rng = random.Random(args.seed)
    tasks = rooms.catalogue("train")
    env = rooms.RoomsEnv()
    start = time.time()
    for i in range(1, args.steps + 1):
        examples = [random_episode(env, rng.choice(tasks), chat, rng, rng.randint(1, args.turns))
                    for _ in range(args.batch)]
        params, opt_state, loss = step(params, opt_state, *map(jnp.asarray, batch(examples)))
        if i % 25 == 0 or i == args.steps:
            print(f"step {i}/{args.steps}  loss {float(loss):.3f}  {time.time() - start:.0f}s", flush=True)
    hf_io.save_pretrained(args.out_dir, config, params)
    print(f"wrote {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
