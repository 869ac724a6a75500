"""Serve a local HF model on an OpenAI-compatible loopback endpoint with our sampler.

    python launch/serve_chat.py --hf /ckpt/Qwen3-8B --port 8011

For environments that need a second model, e.g. tau2-bench's user simulator:
`--config.envs.env_kwargs` can then give tau2 `user=ChatEndpointUser("http://127.0.0.1:8011/v1")`
(see jaxscaffold/envs/tau2.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf", required=True, help="a local HF model directory (with its tokenizer)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--max-len", type=int, default=8192)
    p.add_argument("--dtype", default="bfloat16", help="compute dtype")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO)
    from jaxscaffold.models.hf_io import CheckpointError
    from jaxscaffold.rollout.chat_server import ChatServer
    try:
        server = ChatServer.from_pretrained(args.hf, compute_dtype=args.dtype, host=args.host, port=args.port,
                                            max_len=args.max_len)
    except (CheckpointError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
    print(f"serving {args.hf} on {server.base_url}/chat/completions (Ctrl-C stops)", flush=True)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
