"""How a rooms model acts: `python experiments/rooms_fee/measure.py HF_DIR [--episodes N] [--split S] [--json]`.

Plays N episodes of the rooms testbed with the model (HF directory, `model.vocabulary=rooms`,
e.g. experiments/rooms_fee/base.py's output), in the step-wise rows configs/rooms.py trains on
(`envs.prompts.history_window_text`, history window 0), under four conditions:
  standard   no feedback, sampled at temperature 1 (what a standard-env GRPO group sees)
  greedy     no feedback, greedy (what training-time evaluation scores)
  ag_early   the AG hint (`feedback.enrichers.rooms_ag`) on episode steps 0-2, sampled (FEE's AG window)
  ag_all     the AG hint on every step, sampled (can the model follow guidance at all?)
and prints per condition the success rate, the share of the model's actions that are valid
(listed in the observation's `Actions:` line) and, where hints were shown, the share of hinted
turns on which it took the hinted action.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from jaxscaffold.envs import rooms  # noqa: E402
from jaxscaffold.envs.prompts import history_window_text, system_prompt  # noqa: E402
from jaxscaffold.episodes.driver import complete  # noqa: E402
from jaxscaffold.feedback.enrichers import rooms_ag  # noqa: E402
from jaxscaffold.models import hf_io  # noqa: E402
from jaxscaffold.models.chat import Qwen3ChatRenderer  # noqa: E402
from jaxscaffold.rollout.engine import Sampler, SamplerOptions  # noqa: E402
from jaxscaffold.rollout.sampling import GREEDY, SamplingConfig  # noqa: E402
from jaxscaffold.train.vocabularies import word_tokenizer  # noqa: E402

CONDITIONS = {"standard": (False, 0), "greedy": (True, 0), "ag_early": (False, 3), "ag_all": (False, 10 ** 9)}
MAX_TURNS, MAX_NEW, MAX_LEN = 14, 8, 512  # configs/rooms.py's rollout


def play(params, sampler, tok, chat, tasks, *, hint_steps: int, seed: int) -> dict[str, float]:
    """Success, valid-action and hint-followed rates of one episode per task, all in lockstep."""
    envs = [rooms.RoomsEnv() for _ in tasks]
    obs = [e.reset(t) for e, t in zip(envs, tasks)]
    first = [o.text for o in obs]
    live, won = list(range(len(tasks))), [False] * len(tasks)
    acts = valid = hinted = followed = 0
    for step in range(MAX_TURNS):
        shown = [rooms_ag(obs[i], []) if step < hint_steps else obs[i].text for i in live]
        prompts = [chat.render([{"role": "system", "content": system_prompt("rooms")},
                                {"role": "user", "content": history_window_text(first[i], [], s, step)}],
                               add_generation_prompt=True, enable_thinking=False) for i, s in zip(live, shown)]
        texts = [t for _, t in complete(params, sampler, tok, prompts, max_new_tokens=MAX_NEW, seed=seed * 1000 + step)]
        nxt = []
        for i, text in zip(live, texts):
            action, hint = rooms.read_action(text), obs[i].privileged["next_walkthrough_action"]
            acts += 1
            valid += action in obs[i].privileged["valid_actions"]
            if step < hint_steps and hint:
                hinted += 1
                followed += action == hint
            r = envs[i].step(text)
            obs[i] = r.observation
            won[i] = won[i] or r.info["won"]
            if not r.done:
                nxt.append(i)
        live = nxt
        if not live:
            break
    return {"success": sum(won) / len(tasks), "valid_actions": valid / max(acts, 1),
            "hint_followed": followed / hinted if hinted else None, "episodes": len(tasks)}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("hf_dir")
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--split", default="test", choices=rooms.SPLITS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    tasks = rooms.catalogue(args.split)
    if not 1 <= args.episodes <= len(tasks):
        print(f"error: --episodes must be in 1..{len(tasks)} for split {args.split}", file=sys.stderr)
        return 2
    if not os.path.isfile(os.path.join(args.hf_dir, "config.json")):
        print(f"error: {args.hf_dir} is not an HF model directory (no config.json)", file=sys.stderr)
        return 2
    tok = word_tokenizer("rooms")
    chat = Qwen3ChatRenderer(tok)
    config, params = hf_io.load_pretrained(args.hf_dir, compute_dtype="float32", remat_policy="none")
    tasks = tasks[:args.episodes]
    out = {}
    for name, (greedy, hint_steps) in CONDITIONS.items():
        sampler = Sampler(config, batch_size=len(tasks), max_len=MAX_LEN, stop_ids=tok.eos_ids,
                          options=SamplerOptions(sampling=GREEDY if greedy else SamplingConfig(temperature=1.0),
                                                 cache_dtype="float32"))
        out[name] = play(params, sampler, tok, chat, tasks, hint_steps=hint_steps, seed=args.seed)
        if not args.json:
            r = out[name]
            hf = "-" if r["hint_followed"] is None else f"{r['hint_followed']:.2f}"
            print(f"{name:9s} success {r['success']:.3f}  valid actions {r['valid_actions']:.3f}  hint followed {hf}",
                  flush=True)
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
