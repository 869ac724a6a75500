"""The client of an OpenAI-compatible chat endpoint that plays an environment's simulated
user (tau2-bench's): `ChatEndpointUser(base_url)(messages) -> reply text`.

Standard library only and picklable, so it travels to pool workers in `env_kwargs`; the
endpoint is our sampler's (`jaxscaffold.rollout.chat_server`, started by the trainer as
`train.user_model` says, or `launch/serve_chat.py`) or any other server on that API.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request


class ChatEndpointUser:
    """A user simulator behind an OpenAI-compatible chat endpoint (e.g. a local vLLM or our
    server on 127.0.0.1): `user(messages) -> reply text`, sampled with the given settings."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000/v1", model: str = "default", *,
                 temperature: float = 0.0, top_p: float = 1.0, max_tokens: int = 1024,
                 timeout_s: float = 120.0, api_key: str | None = None, retries: int = 5):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.temperature, self.top_p, self.max_tokens = model, temperature, top_p, max_tokens
        self.timeout_s, self.retries = timeout_s, retries
        # A keyed server (`serve_chat.py --api-key`) wants `Authorization: Bearer KEY`.
        self.api_key = os.environ.get("JAXSCAFFOLD_API_KEY") if api_key is None else api_key

    def __call__(self, messages: list[dict]) -> str:
        body = json.dumps({"model": self.model, "messages": messages, "temperature": self.temperature,
                           "top_p": self.top_p, "max_tokens": self.max_tokens}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        for attempt in range(self.retries + 1):
            req = urllib.request.Request(self.url, data=body, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    out = json.loads(resp.read().decode())
                return out["choices"][0]["message"].get("content") or ""
            except urllib.error.HTTPError as e:
                # A full server queue answers 429 with Retry-After: wait and ask again, a bounded number of times.
                if e.code != 429 or attempt == self.retries:
                    raise
                time.sleep(min(float(e.headers.get("Retry-After") or 1), 10.0))
        raise AssertionError("unreachable")

    def __repr__(self) -> str:
        return (f"ChatEndpointUser({self.url!r}, temperature={self.temperature}, top_p={self.top_p}, "
                f"max_tokens={self.max_tokens})")
