"""The client of an OpenAI-compatible chat endpoint that plays an environment's simulated
user (tau2-bench's): `ChatEndpointUser(base_url)(messages) -> reply text`.

Standard library only and picklable, so it travels to pool workers in `env_kwargs`; the
endpoint is our sampler's (`jaxscaffold.rollout.chat_server`, started by the trainer as
`train.user_model` says, or `launch/serve_chat.py`) or any other server on that API.
"""

from __future__ import annotations

import json
import urllib.request


class ChatEndpointUser:
    """A user simulator behind an OpenAI-compatible chat endpoint (e.g. a local vLLM or our
    server on 127.0.0.1): `user(messages) -> reply text`, sampled with the given settings."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000/v1", model: str = "default", *,
                 temperature: float = 0.0, top_p: float = 1.0, max_tokens: int = 1024,
                 timeout_s: float = 120.0):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.temperature, self.top_p, self.max_tokens = model, temperature, top_p, max_tokens
        self.timeout_s = timeout_s

    def __call__(self, messages: list[dict]) -> str:
        body = json.dumps({"model": self.model, "messages": messages, "temperature": self.temperature,
                           "top_p": self.top_p, "max_tokens": self.max_tokens}).encode()
        req = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            out = json.loads(resp.read().decode())
        return out["choices"][0]["message"].get("content") or ""

    def __repr__(self) -> str:
        return (f"ChatEndpointUser({self.url!r}, temperature={self.temperature}, top_p={self.top_p}, "
                f"max_tokens={self.max_tokens})")
