"""Serve a model on an OpenAI-compatible loopback endpoint with our sampler.

    python launch/serve_chat.py --hf /ckpt/Qwen3-8B --port 8011
    python launch/serve_chat.py --preset tiny           # a random tiny model: try the API offline

Routes: `POST /v1/chat/completions` (concurrent requests batched into the sampler's slots;
`"stream": true` gives server-sent chunks) and `GET /v1/models`. For environments that need a
second model, e.g. tau2-bench's user simulator, on another accelerator or host than the
trainer's: `--config.envs.tau2_user.mode=endpoint --config.envs.tau2_user.url=http://127.0.0.1:8011/v1`
(by default, `envs.tau2_user.mode=model`, the trainer serves the user model itself in its own
process: jaxscaffold/train/user_model.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build_server(args):
    """The ChatServer of the parsed arguments (a checkpoint, or a preset's random weights)."""
    from jaxscaffold.rollout.chat_server import ChatServer
    options = dict(host=args.host, port=args.port, max_len=args.max_len, slots=args.slots,
                   enable_thinking=args.thinking)
    if args.hf:
        return ChatServer.from_pretrained(args.hf, compute_dtype=args.dtype, model_name=args.hf, **options)
    return ChatServer.from_preset(args.preset, seed=args.seed, compute_dtype=args.dtype, **options)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--hf", help="a local HF model directory (with its tokenizer)")
    source.add_argument("--preset", help="random weights of a preset (tiny, qwen3-0.6b, ...) with the Qwen3 vocabulary")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--max-len", type=int, default=8192, help="prompt + reply tokens of a request, at most")
    p.add_argument("--slots", type=int, default=8, help="requests generated together, at most")
    p.add_argument("--dtype", default="bfloat16", help="compute dtype")
    p.add_argument("--thinking", action="store_true", help="let the model reason before replying")
    p.add_argument("--seed", type=int, default=0, help="the random weights' seed (--preset)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from jaxscaffold.models.hf_io import CheckpointError
    try:
        server = build_server(args)
    except (CheckpointError, ValueError, KeyError, OSError) as e:
        print(f"error: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        sys.exit(2)
    print(f"serving {args.hf or args.preset} on {server.base_url}/chat/completions, {args.slots} slots "
          "(Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
