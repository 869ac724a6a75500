"""An OpenAI-compatible chat endpoint on loopback, served by our sampler with a local model.

Environments that need a second model, such as tau2-bench's user simulator, run in pool
worker processes (or in process); they reach the model through `POST /v1/chat/completions` (the
`jaxscaffold.envs.chat_user.ChatEndpointUser` client, or any OpenAI-style client; a run's tau2
user is served so by `jaxscaffold.train.user_model`); `GET /v1/models`
names the model. Concurrent requests are batched: one thread runs the sampler, taking up to
`slots` waiting requests of the same sampling settings into one generation (a reply does not
depend on its batch-mates: the sampler is batch-invariant), so a pool of envs is served
together rather than one by one. `temperature` 0 is greedy. `"stream": true` answers with
OpenAI's server-sent chunks; they are sent when the reply is complete, since the decode loop
runs inside one compiled program.

    server = ChatServer.from_pretrained("/ckpt/Qwen3-8B", port=8011).start()
    ...  # envs use http://127.0.0.1:8011/v1
    server.stop()
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import logging
import queue
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


@dataclasses.dataclass
class _Request:
    """A checked request waiting for the generation thread."""

    number: int
    ids: list[int]
    sampling: tuple[float, float]  # (temperature, top_p): requests batch with their equals
    max_tokens: int
    seed: int
    reply: concurrent.futures.Future


class ChatServer:
    """Serves `params` of `config` with Qwen3's chat format; `max_len` bounds prompt + reply;
    `slots` requests are generated together at most; a batch waits `batch_window_s` for
    requests to join it."""

    def __init__(self, config, params, tokenizer: Tokenizer, *, host: str = "127.0.0.1", port: int = 0,
                 max_len: int = 8192, enable_thinking: bool = False, model_name: str = "local",
                 slots: int = 8, batch_window_s: float = 0.01):
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.config, self.params, self.tokenizer = config, params, tokenizer
        self.chat = Qwen3ChatRenderer(tokenizer)
        self.max_len, self.enable_thinking, self.model_name = max_len, enable_thinking, model_name
        self.slots, self.batch_window_s = slots, batch_window_s
        self._samplers: dict[tuple[float, float], Sampler] = {}
        self._prepared = None  # the parameters in the samplers' decode layout, made on first use
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._count_lock = threading.Lock()
        self._requests = 0
        self.batch_sizes: collections.Counter[int] = collections.Counter()  # batch size -> batches run
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self._threads: list[threading.Thread] = []

    @classmethod
    def from_pretrained(cls, path: str, *, mesh=None, compute_dtype: str = "bfloat16", dtype: str = "float32",
                        **kwargs) -> "ChatServer":
        """A server of the HF checkpoint at `path` (weights in `dtype`, default f32 masters;
        a server that only samples can hold them in its compute dtype)."""
        config, params = hf_io.load_pretrained(path, dtype=dtype, mesh=mesh, compute_dtype=compute_dtype)
        return cls(config, params, load_tokenizer(path), **kwargs)

    @classmethod
    def from_preset(cls, preset: str, *, seed: int = 0, compute_dtype: str = "bfloat16", **kwargs) -> "ChatServer":
        """A server of a preset's random weights (`tiny`, `qwen3-0.6b`, ...; seeded) with the
        offline Qwen3 tokenizer: for tests and demos."""
        import jax

        from jaxscaffold.models import config as model_config, qwen3
        config = (model_config.tiny(compute_dtype=compute_dtype) if preset.lower() == "tiny"
                  else model_config.preset(preset, compute_dtype=compute_dtype))
        params = qwen3.init_params(config, jax.random.key(seed))
        return cls(config, params, load_tokenizer(None), model_name=kwargs.pop("model_name", f"{preset}-random"),
                   **kwargs)

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> "ChatServer":
        self._threads = [threading.Thread(target=self._generate_batches, name="chat-generate", daemon=True),
                         threading.Thread(target=self.httpd.serve_forever, name="chat-server", daemon=True)]
        for t in self._threads:
            t.start()
        log.info("chat server on %s (%d slots)", self.base_url, self.slots)
        return self

    def serve_forever(self) -> None:
        """Serves in this thread until interrupted (the generation thread runs beside it)."""
        self._threads = [threading.Thread(target=self._generate_batches, name="chat-generate", daemon=True)]
        self._threads[0].start()
        try:
            self.httpd.serve_forever()
        finally:
            self._queue.put(None)

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._queue.put(None)

    def __enter__(self) -> "ChatServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _sampler(self, key: tuple[float, float]) -> Sampler:
        if key not in self._samplers:
            temperature, top_p = key
            sampling = GREEDY if temperature <= 0 else SamplingConfig(temperature=temperature, top_p=top_p)
            self._samplers[key] = Sampler(self.config, batch_size=self.slots, max_len=self.max_len,
                                          sampling=sampling, stop_ids=self.tokenizer.eos_ids)
        return self._samplers[key]

    def submit(self, request: dict) -> concurrent.futures.Future:
        """Checks a request body (ValueError if bad) and queues it; the future gives the
        OpenAI chat.completions response."""
        messages = request.get("messages")
        if not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content", ""), str)
                for m in messages):
            raise ValueError("'messages' must be a list of {role, content} objects")
        temperature = float(request.get("temperature", 1.0) or 0.0)
        top_p = float(request.get("top_p", 1.0))
        max_tokens = int(request.get("max_tokens") or 1024)
        if max_tokens < 1 or not 0 < top_p <= 1:
            raise ValueError(f"max_tokens must be >= 1 and top_p in (0, 1], got {max_tokens}, {top_p}")
        ids = self.chat.render(messages, add_generation_prompt=True, enable_thinking=self.enable_thinking)
        if len(ids) + 1 >= self.max_len:
            raise ValueError(f"the prompt has {len(ids)} tokens; this server's max_len is {self.max_len}")
        with self._count_lock:
            self._requests += 1
            number = self._requests
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put(_Request(number, ids, (round(temperature, 4), round(top_p, 4)), max_tokens,
                                 int(request.get("seed", number)), future))
        return future

    def reply(self, request: dict, timeout_s: float | None = None) -> dict:
        """The OpenAI chat.completions response for a request body (ValueError if bad)."""
        return self.submit(request).result(timeout_s)

    def _generate_batches(self) -> None:
        waiting: list[_Request] = []
        while True:
            if not waiting:
                first = self._queue.get()
                if first is None:
                    return
                waiting.append(first)
            deadline = time.monotonic() + self.batch_window_s
            while len(waiting) < 4 * self.slots:  # gather what arrives within the window
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    return
                waiting.append(item)
            key = waiting[0].sampling
            batch = [r for r in waiting if r.sampling == key][: self.slots]
            waiting = [r for r in waiting if r not in batch]
            self._run(key, batch)

    def _run(self, key: tuple[float, float], batch: list[_Request]) -> None:
        try:
            sampler = self._sampler(key)
            if self._prepared is None:  # every sampler here has the same layout: one copy serves all
                self._prepared = sampler.prepare(self.params)
            mt = MultiTurn(sampler)
            mt.extend(self._prepared, {slot: r.ids for slot, r in enumerate(batch)})
            gens = mt.generate(self._prepared, list(range(len(batch))), max_new_tokens=max(r.max_tokens for r in batch),
                               seeds=[r.seed for r in batch])
            self.batch_sizes[len(batch)] += 1
        except Exception as e:  # a failed generation fails its requests, not the server
            log.exception("chat server: generation failed")
            for r in batch:
                r.reply.set_exception(e)
            return
        for slot, r in enumerate(batch):
            r.reply.set_result(self._response(r, gens[slot]))

    def _response(self, r: _Request, gen) -> dict:
        # A request shorter than its batch's longest is cut to its own max_tokens: the tokens
        # it keeps are those it would have had alone.
        tokens = [int(t) for t in gen.tokens][: r.max_tokens]
        stopped = gen.finish_reason == "stop" and len(tokens) == len(gen.tokens)
        text = _THINK.sub("", self.tokenizer.decode([t for t in tokens if t not in self.tokenizer.eos_ids])).strip()
        return {"id": f"chatcmpl-{r.number}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "stop" if stopped else "length"}],
                "usage": {"prompt_tokens": len(r.ids), "completion_tokens": len(tokens),
                          "total_tokens": len(r.ids) + len(tokens)}}

    def models(self) -> dict:
        """`GET /v1/models`: the one model served."""
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "jaxscaffold"}]}


def stream_chunks(response: dict) -> list[dict]:
    """A chat.completions response as OpenAI's `chat.completion.chunk` events (role, content,
    finish), for `"stream": true`."""
    choice = response["choices"][0]
    base = {"id": response["id"], "object": "chat.completion.chunk", "created": response["created"],
            "model": response["model"]}
    return [{**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]},
            {**base, "choices": [{"index": 0, "delta": {"content": choice["message"]["content"]},
                                  "finish_reason": None}]},
            {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}]


def _handler(server: ChatServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a client's requests reuse one connection

        def do_GET(self):  # noqa: N802 (http.server's naming)
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                return self._send(200, server.models())
            return self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self):  # noqa: N802
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("the request body must be a JSON object")
                response = server.reply(body)
            except (ValueError, TypeError, json.JSONDecodeError) as e:
                return self._send(400, {"error": {"message": str(e)}})
            except Exception as e:  # a failed generation is a 500 for this request, not a dead server
                log.exception("chat server: request failed")
                return self._send(500, {"error": {"message": f"{type(e).__name__}: {e}"}})
            if body.get("stream"):
                return self._stream(response)
            return self._send(200, response)

        def _send(self, code: int, obj: dict):
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, response: dict):
            events = [f"data: {json.dumps(c)}\n\n" for c in stream_chunks(response)] + ["data: [DONE]\n\n"]
            data = "".join(events).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt, *args):
            log.debug("chat server: " + fmt, *args)
    return Handler
