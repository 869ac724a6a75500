"""Serve a model on an OpenAI-compatible loopback endpoint with our sampler.

    python launch/serve_chat.py --hf /ckpt/Qwen3-8B --port 8011
    python launch/serve_chat.py --preset tiny           # a random tiny model: try the API offline

Routes: `POST /v1/chat/completions` (concurrent requests batched into the sampler's slots;
`"stream": true` gives server-sent chunks) and `GET /v1/models`. For environments that need a
second model, e.g. tau2-bench's user simulator, on another accelerator or host than the
trainer's: `--config.envs.tau2_user.mode=endpoint --config.envs.tau2_user.url=http://127.0.0.1:8011/v1`
(by default, `envs.tau2_user.mode=model`, the trainer serves the user model itself in its own
process: jaxscaffold/train/user_model.py).

The limits that keep any client from stalling or bloating the server, and their flags, are in
docs/serving.md. `--api-key KEY` (or the environment variable JAXSCAFFOLD_API_KEY) requires
`Authorization: Bearer KEY` on every request; binding a non-loopback `--host` without one logs a
warning.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build_server(args):
    """The ChatServer of the parsed arguments (a checkpoint, or a preset's random weights);
    its limits are checked before the model loads."""
    from jaxscaffold.rollout.chat_server import ChatServer, check_limits
    cap = min(4096, args.max_len - 1) if args.max_tokens_cap is None else args.max_tokens_cap
    limits = dict(max_len=args.max_len, slots=args.slots, batch_window_s=0.01, max_tokens_cap=cap,
                  max_queue=args.max_queue, max_sampling_settings=args.max_sampling_settings, max_samplers=4,
                  max_body_bytes=args.max_body_bytes, request_timeout_s=args.request_timeout,
                  idle_timeout_s=args.idle_timeout, backlog=args.backlog)
    check_limits(**limits)
    options = dict(host=args.host, port=args.port, enable_thinking=args.thinking, api_key=args.api_key, **limits)
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
    limits = p.add_argument_group("limits (docs/serving.md)")
    limits.add_argument("--max-tokens-cap", type=int, default=None,
                        help="a request's max_tokens, at most (default: min(4096, max-len - 1))")
    limits.add_argument("--max-queue", type=int, default=64, help="requests waiting or generating; more get 429")
    limits.add_argument("--max-sampling-settings", type=int, default=8,
                        help="distinct (temperature, top_p) grid points compiled, at most; a new one past it is a 400")
    limits.add_argument("--max-body-bytes", type=int, default=1 << 20, help="a request body's size; more is a 413")
    limits.add_argument("--request-timeout", type=float, default=30.0,
                        help="seconds a request's headers and body may take to arrive")
    limits.add_argument("--idle-timeout", type=float, default=60.0,
                        help="seconds an open connection may wait for its next request")
    limits.add_argument("--backlog", type=int, default=128, help="connections waiting to be accepted")
    limits.add_argument("--api-key", default=os.environ.get("JAXSCAFFOLD_API_KEY") or None,
                        help="require 'Authorization: Bearer KEY' (default: $JAXSCAFFOLD_API_KEY, which, unlike "
                        "a flag, other users cannot read in the process list; none)")
    p.add_argument("--verbose", action="store_true", help="log every request")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    # The server's own lines (a client gone, a request timed out) at INFO; every request with --verbose.
    logging.getLogger("jaxscaffold.rollout.chat_server").setLevel(logging.DEBUG if args.verbose else logging.INFO)
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
