"""An OpenAI-compatible chat endpoint on loopback, served by our sampler with a local model.

Environments that need a second model, such as tau2-bench's user simulator, run in pool
worker processes; they reach the model through `POST /v1/chat/completions` (the
`jaxscaffold.envs.tau2.ChatEndpointUser` client, or any OpenAI-style client). Requests are
served one at a time (one sampler); `temperature` 0 is greedy.

    server = ChatServer.from_pretrained("/ckpt/Qwen3-8B", port=8011).start()
    ...  # envs use http://127.0.0.1:8011/v1
    server.stop()
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from jaxscaffold.models import hf_io
from jaxscaffold.models.chat import Qwen3ChatRenderer
from jaxscaffold.models.tokenizer import Tokenizer, load_tokenizer
from jaxscaffold.rollout.conversation import MultiTurn
from jaxscaffold.rollout.engine import Sampler
from jaxscaffold.rollout.sampling import GREEDY, SamplingConfig

log = logging.getLogger(__name__)
_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


class ChatServer:
    """Serves `params` of `config` with Qwen3's chat format; `max_len` bounds prompt + reply."""

    def __init__(self, config, params, tokenizer: Tokenizer, *, host: str = "127.0.0.1", port: int = 0,
                 max_len: int = 8192, enable_thinking: bool = False, model_name: str = "local"):
        self.config, self.params, self.tokenizer = config, params, tokenizer
        self.chat = Qwen3ChatRenderer(tokenizer)
        self.max_len, self.enable_thinking, self.model_name = max_len, enable_thinking, model_name
        self._samplers: dict[float, Sampler] = {}
        self._prepared = None  # the parameters in the samplers' decode layout, made on first use
        self._lock = threading.Lock()  # one request at a time on the one model
        self._requests = 0
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self._thread: threading.Thread | None = None

    @classmethod
    def from_pretrained(cls, path: str, *, mesh=None, compute_dtype: str = "bfloat16", **kwargs) -> "ChatServer":
        config, params = hf_io.load_pretrained(path, mesh=mesh, compute_dtype=compute_dtype)
        return cls(config, params, load_tokenizer(path), **kwargs)

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> "ChatServer":
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="chat-server", daemon=True)
        self._thread.start()
        log.info("chat server on %s", self.base_url)
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "ChatServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _sampler(self, temperature: float, top_p: float) -> Sampler:
        key = (round(temperature, 4), round(top_p, 4))
        if key not in self._samplers:
            sampling = GREEDY if temperature <= 0 else SamplingConfig(temperature=temperature, top_p=top_p)
            self._samplers[key] = Sampler(self.config, batch_size=1, max_len=self.max_len, sampling=sampling)
        return self._samplers[key]

    def reply(self, request: dict) -> dict:
        """An OpenAI chat.completions response for a request body (raises ValueError if bad)."""
        messages = request.get("messages")
        if not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content", ""), str)
                for m in messages):
            raise ValueError("'messages' must be a list of {role, content} objects")
        temperature = float(request.get("temperature", 1.0) or 0.0)
        max_tokens = int(request.get("max_tokens") or 1024)
        ids = self.chat.render(messages, add_generation_prompt=True, enable_thinking=self.enable_thinking)
        if len(ids) + 1 >= self.max_len:
            raise ValueError(f"the prompt has {len(ids)} tokens; this server's max_len is {self.max_len}")
        with self._lock:
            self._requests += 1
            sampler = self._sampler(temperature, float(request.get("top_p", 1.0)))
            if self._prepared is None:  # every sampler here has the same layout: one copy serves all
                self._prepared = sampler.prepare(self.params)
            mt = MultiTurn(sampler)
            mt.extend(self._prepared, {0: ids})
            gen = mt.generate(self._prepared, [0], max_new_tokens=max_tokens,
                              seeds=[int(request.get("seed", self._requests))])[0]
        tokens = [int(t) for t in gen.tokens if t not in self.tokenizer.eos_ids]
        text = _THINK.sub("", self.tokenizer.decode(tokens)).strip()
        return {"id": f"chatcmpl-{self._requests}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "stop" if gen.finish_reason == "stop" else "length"}],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": len(gen.tokens),
                          "total_tokens": len(ids) + len(gen.tokens)}}


def _handler(server: ChatServer):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's naming)
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                return self._send(200, server.reply(body))
            except (ValueError, TypeError, json.JSONDecodeError) as e:
                return self._send(400, {"error": {"message": str(e)}})
            except Exception as e:  # a failed generation is a 500 for this request, not a dead server
                log.exception("chat server: request failed")
                return self._send(500, {"error": {"message": f"{type(e).__name__}: {e}"}})

        def _send(self, code: int, obj: dict):
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt, *args):
            log.debug("chat server: " + fmt, *args)
    return Handler
