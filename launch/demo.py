"""A tour of the model pieces, one at a time, on a tiny random Qwen3 with the real Qwen3
vocabulary (the training loop itself is `bash launch/dev.sh demo`: `launch/tpu_train.py
--config tiny.py`):

  init (sharded over all devices) -> export to an HF directory (with the offline tokenizer)
  -> load it back, streaming -> render a chat to ids -> sample a multi-turn rollout with the
  KV-cache sampler -> check the sampler's logprobs against a teacher-forced forward.

Run: `python launch/demo.py [--out DIR]` (without --out the export goes to a temporary
directory, removed at the end).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxscaffold.models import config as model_config
from jaxscaffold.models import hf_io, qwen3
from jaxscaffold.models.chat import Qwen3ChatRenderer
from jaxscaffold.models.sharding import MeshConfig, make_mesh
from jaxscaffold.models.tokenizer import QwenOfflineTokenizer, cached_hf_tokenizer_dir
from jaxscaffold.rollout.conversation import MultiTurn
from jaxscaffold.rollout.engine import Sampler, SamplerOptions
from jaxscaffold.rollout.sampling import SamplingConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="where to write the HF export (default: a temporary dir, removed)")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    args = parser.parse_args()

    t0 = time.perf_counter()
    mesh = make_mesh(MeshConfig(data=-1))
    config = model_config.tiny()
    params = qwen3.init_params(config, jax.random.key(0), mesh=mesh)
    print(f"[model] tiny Qwen3: {config.num_params() / 1e6:.1f}M parameters on {jax.device_count()} "
          f"{jax.default_backend()} device(s), mesh {dict(mesh.shape)}")

    with tempfile.TemporaryDirectory(prefix="jaxscaffold-demo-") as scratch:
        tour(args, mesh, config, params, args.out or scratch, t0)


def tour(args, mesh, config, params, out: str, t0: float) -> None:
    """Everything after the init, with the HF export written to `out`."""
    hf_io.save_pretrained(out, config, params, tokenizer_dir=str(cached_hf_tokenizer_dir()))
    config, params = hf_io.load_pretrained(out, mesh=mesh)
    print(f"[hf] exported to and reloaded from {out}: {sorted(os.listdir(out))}")

    tokenizer = QwenOfflineTokenizer()
    chat = Qwen3ChatRenderer(tokenizer)
    prompt = chat.render([{"role": "system", "content": "You are a lab assistant in ScienceWorld."},
                          {"role": "user", "content": "Your task is to boil water. What do you do first?"}],
                         add_generation_prompt=True)
    print(f"[chat] prompt of {len(prompt)} ids: {tokenizer.decode(prompt)!r}")

    sampler = Sampler(config, stop_ids=tokenizer.eos_ids, batch_size=2, max_len=512, mesh=None,
                      options=SamplerOptions(sampling=SamplingConfig(temperature=1.0, top_p=0.95)))
    rollouts = MultiTurn(sampler)
    rollouts.extend(params, {0: prompt, 1: prompt})
    t1 = time.perf_counter()
    for turn in range(args.turns):
        gens = rollouts.generate(params, [0, 1], max_new_tokens=args.max_new_tokens, seeds=[1, 2])
        for slot, g in gens.items():
            print(f"[turn {turn}] slot {slot} ({g.finish_reason}, {len(g.tokens)} tokens): "
                  f"{tokenizer.decode(g.tokens)[:80]!r}")
        observation = chat.continue_with_user(f"You see a sink and a stove. (observation {turn + 1})")
        if not all(g.finish_reason == "stop" for g in gens.values()):
            observation = [tokenizer.token_id("<|im_end|>")] + observation  # close a cut-off turn
        rollouts.extend(params, {0: observation, 1: observation})
    elapsed = time.perf_counter() - t1

    conv = rollouts.conversations[0].arrays()
    logits = jax.jit(qwen3.forward, static_argnums=1)(params, config, jnp.asarray(conv["ids"])[None])[0]
    logp = jax.nn.log_softmax(logits, -1)
    ref = np.asarray(jnp.take_along_axis(logp[:-1], jnp.asarray(conv["ids"][1:])[:, None], -1)[:, 0])
    gen = conv["assistant_mask"][1:] == 1
    gap = float(np.max(np.abs(conv["logprobs"][1:][gen] - ref[gen])))
    print(f"[rollout] {len(conv['ids'])} ids, {int(conv['assistant_mask'].sum())} generated; "
          f"{args.turns} turns in {elapsed:.1f}s (incl. compilation); "
          f"max |sampler - teacher-forced| logprob gap {gap:.1e} (bf16 cache)")
    print(f"[done] {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    main()
