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

What no client can do (docs/serving.md lists the limits and their flags): send a request the
sampler cannot serve (each field is checked; a bad one is a 400 in OpenAI's error shape, never a
500), make the server compile without bound (temperature and top_p are rounded to a grid, and
at most `max_sampling_settings` distinct settings are ever compiled: JAX keeps a compiled
program for the life of the process, so that count is what bounds the memory; the `Sampler`
objects are an LRU of `max_samplers`), hold the generation thread for long (`max_tokens` is
capped), queue without bound (`max_queue` requests wait at most; more get 429 with
Retry-After), hold a connection thread (a request must arrive whole within
`request_timeout_s`, an idle keep-alive connection is closed after `idle_timeout_s`), or use
the server without the key when one is set (`api_key`: `Authorization: Bearer KEY`).

The HTTP layer is the standard library's ThreadingHTTPServer, hardened here, rather than a
server library: the project has no HTTP server dependency (uvicorn and starlette are in a full
environment only through tau2-bench's extras), the server is one generation thread fed by a
queue, which blocking handler threads suit, and the hardening (limits, timeouts, error shape)
is needed whichever library parses the bytes.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hmac
import ipaddress
import json
import logging
import math
import queue
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from jaxscaffold.models import hf_io
from jaxscaffold.models.chat import Qwen3ChatRenderer
from jaxscaffold.models.tokenizer import Tokenizer, load_tokenizer
from jaxscaffold.rollout.conversation import MultiTurn
from jaxscaffold.rollout.engine import Sampler, SamplerOptions
from jaxscaffold.rollout.sampling import GREEDY, SamplingConfig

log = logging.getLogger(__name__)
_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)

ROLES = ("system", "user", "assistant", "tool")
MODEL_ALIASES = ("default",)  # also served under these names: jaxscaffold's ChatEndpointUser sends "default"
TEMPERATURE_STEP, TOP_P_STEP = 0.1, 0.05  # the sampling grid: each point on it is one compiled program
MAX_TEMPERATURE = 2.0  # OpenAI's range


class RequestError(ValueError):
    """A request the server refuses: its HTTP status and OpenAI's error fields."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def body(self) -> dict:
        """OpenAI's error object: `{"error": {"message", "type", "param", "code"}}`."""
        return error_body(str(self), kind=self.kind, param=self.param, code=self.code)


def error_body(message: str, *, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """An error response body in OpenAI's shape."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or "localhost") reaches only this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def parse_json(data: bytes):
    """A request body as JSON: strict (no NaN / Infinity literals); any malformation, also
    nesting too deep for the parser, is a RequestError (400)."""
    try:
        return json.loads(data, parse_constant=_reject_constant)
    except RecursionError:
        raise RequestError("the request body is nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, bad UTF-8, NaN literals, an integer of > 4300 digits
        raise RequestError(f"the request body is not valid JSON: {e}") from None


@dataclasses.dataclass
class _Request:
    """A checked request waiting for the generation thread."""

    number: int
    ids: list[int]
    sampling: tuple[float, float]  # (temperature, top_p) on the grid: requests batch with their equals
    max_tokens: int
    seed: int
    reply: concurrent.futures.Future


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, handler, backlog: int):
        self.request_queue_size = backlog  # listen()'s backlog (the stdlib's 5 reset bursts of connections)
        super().__init__(address, handler)

    def handle_error(self, request, client_address):
        # A client that went away is one line; anything else is a bug worth its traceback.
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            log.info("chat server: connection from %s ended: %s", client_address[0], type(error).__name__)
        else:
            log.exception("chat server: error on a connection from %s", client_address[0])


def check_limits(*, max_len, slots, batch_window_s, max_tokens_cap, max_queue, max_sampling_settings,
                 max_samplers, max_body_bytes, request_timeout_s, idle_timeout_s, backlog) -> int:
    """The max_tokens cap of a server's limits (None: max_len - 1); ValueError naming the first
    bad limit (a launcher checks them before it loads a model)."""
    if max_tokens_cap is None and isinstance(max_len, int):
        max_tokens_cap = max_len - 1
    for name, value, low in (("max_len", max_len, 2), ("slots", slots, 1), ("max_queue", max_queue, 1),
                             ("max_samplers", max_samplers, 1), ("max_sampling_settings", max_sampling_settings, 1),
                             ("max_body_bytes", max_body_bytes, 1), ("backlog", backlog, 1),
                             ("max_tokens_cap", max_tokens_cap, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if max_tokens_cap >= max_len:
        raise ValueError(f"max_tokens_cap={max_tokens_cap} must be below max_len={max_len}")
    for name, value, low in (("request_timeout_s", request_timeout_s, 1e-3), ("idle_timeout_s", idle_timeout_s, 1e-3),
                             ("batch_window_s", batch_window_s, 0.0)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= low):
            raise ValueError(f"{name} must be a finite number >= {low:g}, got {value!r}")
    return max_tokens_cap


class ChatServer:
    """Serves `params` of `config` with Qwen3's chat format; `max_len` bounds prompt + reply;
    `slots` requests are generated together at most; a batch waits `batch_window_s` for
    requests to join it.

    Limits (docs/serving.md): `max_tokens_cap` (a reply's tokens; default max_len - 1: a trainer's
    own user server takes what its config allows; `launch/serve_chat.py` defaults to 4096),
    `max_queue` (requests being checked, waiting or generating; more get 429), `max_sampling_settings`
    (distinct (temperature, top_p) grid points ever compiled; a new one past it is a 400),
    `max_samplers` (Sampler objects kept, LRU), `max_body_bytes` (a request body; 413 past it),
    `request_timeout_s` (a request's headers and body must arrive within it),
    `idle_timeout_s` (a connection with no request is closed after it), `backlog` (connections
    waiting to be accepted). `api_key`: if set, every route requires `Authorization: Bearer
    <api_key>` (401 otherwise).
    """

    def __init__(self, config, params, tokenizer: Tokenizer, *, host: str = "127.0.0.1", port: int = 0,
                 max_len: int = 8192, enable_thinking: bool = False, model_name: str = "local",
                 slots: int = 8, batch_window_s: float = 0.01, max_tokens_cap: int | None = None,
                 max_queue: int = 64, max_sampling_settings: int = 8, max_samplers: int = 4,
                 max_body_bytes: int = 1 << 20, request_timeout_s: float = 30.0, idle_timeout_s: float = 60.0,
                 backlog: int = 128, api_key: str | None = None):
        max_tokens_cap = check_limits(
            max_len=max_len, slots=slots, batch_window_s=batch_window_s, max_tokens_cap=max_tokens_cap,
            max_queue=max_queue, max_sampling_settings=max_sampling_settings, max_samplers=max_samplers,
            max_body_bytes=max_body_bytes, request_timeout_s=request_timeout_s, idle_timeout_s=idle_timeout_s,
            backlog=backlog)
        self.config, self.params, self.tokenizer = config, params, tokenizer
        self.chat = Qwen3ChatRenderer(tokenizer)
        self.max_len, self.enable_thinking, self.model_name = max_len, enable_thinking, model_name
        self.slots, self.batch_window_s = slots, batch_window_s
        self.max_tokens_cap, self.max_queue, self.max_body_bytes = max_tokens_cap, max_queue, max_body_bytes
        self.max_sampling_settings, self.max_samplers = max_sampling_settings, max_samplers
        self.request_timeout_s, self.idle_timeout_s = request_timeout_s, idle_timeout_s
        self.api_key = api_key or None
        self._samplers: collections.OrderedDict[tuple[float, float], Sampler] = collections.OrderedDict()  # LRU
        self._settings: set[tuple[float, float]] = set()  # every sampling setting admitted (compiled or soon)
        self._prepared = None  # the parameters in the samplers' decode layout, made on first use
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._count_lock = threading.Lock()
        self._requests = 0
        self._pending = 0  # requests queued or generating
        self.batch_sizes: collections.Counter[int] = collections.Counter()  # batch size -> batches run
        self.httpd = _HTTPServer((host, port), _handler(self), backlog)
        self._threads: list[threading.Thread] = []
        if self.api_key is None and not is_loopback(self.httpd.server_address[0]):
            log.warning("chat server: listening on %s, which is not a loopback address, without an API key: "
                        "anyone who reaches it can use the model (set --api-key or JAXSCAFFOLD_API_KEY)", host)

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

    @property
    def sampler_count(self) -> int:
        """Sampler objects held now (at most `max_samplers`)."""
        return len(self._samplers)

    def _sampler(self, key: tuple[float, float]) -> Sampler:
        sampler = self._samplers.pop(key, None)
        if sampler is None:
            temperature, top_p = key
            sampling = GREEDY if temperature <= 0 else SamplingConfig(temperature=temperature, top_p=top_p)
            sampler = Sampler(self.config, batch_size=self.slots, max_len=self.max_len,
                              stop_ids=self.tokenizer.eos_ids, options=SamplerOptions(sampling=sampling))
        self._samplers[key] = sampler  # the most recently used last
        while len(self._samplers) > self.max_samplers:
            self._samplers.popitem(last=False)
        return sampler

    def check(self, request) -> tuple[list[int], tuple[float, float], int, int]:
        """(prompt ids, (temperature, top_p) on the grid, max_tokens, seed) of a request body;
        RequestError (a ValueError) naming the first bad field."""
        if not isinstance(request, dict):
            raise RequestError("the request body must be a JSON object")
        model = request.get("model")
        if model is not None and model != self.model_name and model not in MODEL_ALIASES:
            if not isinstance(model, str):
                raise RequestError("'model' must be a string", param="model")
            raise RequestError(f"the model {_show(model)} does not exist; this server serves {self.model_name!r}",
                               status=404, param="model", code="model_not_found")
        messages = _check_messages(request.get("messages"))
        temperature = _number(request, "temperature", 1.0, 0.0, MAX_TEMPERATURE)
        top_p = _number(request, "top_p", 1.0, 0.0, 1.0, low_open=True)
        name = "max_tokens" if request.get("max_tokens") is not None else "max_completion_tokens"
        max_tokens = request.get(name)
        if max_tokens is None:
            max_tokens = min(1024, self.max_tokens_cap)
        elif not _is_int(max_tokens) or not 1 <= max_tokens <= self.max_tokens_cap:
            raise RequestError(f"'{name}' must be an integer in [1, {self.max_tokens_cap}] (this server's cap), "
                               f"got {_show(max_tokens)}", param=name)
        n = request.get("n", 1)
        if n is not None and n != 1:
            raise RequestError("only 'n': 1 is served", param="n")
        if not isinstance(request.get("stream", False), (bool, type(None))):
            raise RequestError("'stream' must be a boolean", param="stream")
        seed = request.get("seed")
        if seed is not None and not _is_int(seed):
            raise RequestError(f"'seed' must be an integer, got {_show(seed)}", param="seed")
        try:
            ids = self.chat.render(messages, add_generation_prompt=True, enable_thinking=self.enable_thinking)
        except (ValueError, TypeError, KeyError, AttributeError) as e:  # e.g. a malformed tool call
            raise RequestError(f"'messages' cannot be rendered: {e}", param="messages") from None
        if len(ids) + 1 >= self.max_len:
            raise RequestError(f"the prompt has {len(ids)} tokens; this server's max_len is {self.max_len}",
                               param="messages", code="context_length_exceeded")
        # On the grid: nearby values share one compiled program (greedy ignores top_p).
        temperature = round(round(temperature / TEMPERATURE_STEP) * TEMPERATURE_STEP, 6)
        top_p = 1.0 if temperature == 0 else round(max(1, round(top_p / TOP_P_STEP)) * TOP_P_STEP, 6)
        return ids, (temperature, top_p), max_tokens, seed

    def submit(self, request: dict) -> concurrent.futures.Future:
        """Checks a request body (RequestError, a ValueError, if bad; status 429 when
        `max_queue` requests are being checked, wait or generate already) and queues it; the
        future gives the OpenAI chat.completions response."""
        with self._count_lock:  # admitted before the check: rendering a long prompt costs CPU too
            if self._pending >= self.max_queue:
                raise RequestError(f"the server is busy ({self._pending} requests waiting); retry shortly",
                                   status=429, kind="rate_limit_error", code="server_busy")
            self._pending += 1
        try:
            ids, sampling, max_tokens, seed = self.check(request)
            with self._count_lock:
                if sampling not in self._settings and len(self._settings) >= self.max_sampling_settings:
                    served = ", ".join(f"temperature {t:g} top_p {p:g}" for t, p in sorted(self._settings))
                    raise RequestError(f"this server compiles at most {self.max_sampling_settings} sampling "
                                       f"settings and serves these: {served}", param="temperature",
                                       code="unsupported_sampling")
                self._settings.add(sampling)
                self._requests += 1
                number = self._requests
        except BaseException:
            self._done(None)
            raise
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.add_done_callback(self._done)
        self._queue.put(_Request(number, ids, sampling, max_tokens, number if seed is None else seed, future))
        return future

    def _done(self, _future) -> None:
        with self._count_lock:
            self._pending -= 1

    def reply(self, request: dict, timeout_s: float | None = None) -> dict:
        """The OpenAI chat.completions response for a request body (RequestError if bad)."""
        return self.submit(request).result(timeout_s)

    def _generate_batches(self) -> None:
        waiting: list[_Request] = []
        while True:
            if not waiting:
                first = self._queue.get()
                if first is None:
                    return self._refuse_waiting(waiting)
                waiting.append(first)
            deadline = time.monotonic() + self.batch_window_s
            while len(waiting) < 4 * self.slots:  # gather what arrives within the window
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    return self._refuse_waiting(waiting)
                waiting.append(item)
            key = waiting[0].sampling
            batch = [r for r in waiting if r.sampling == key][: self.slots]
            waiting = [r for r in waiting if r not in batch]
            self._run(key, batch)

    def _refuse_waiting(self, waiting: list[_Request]) -> None:
        """On stop: the requests not generated get a 503 rather than a wait without end."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                waiting.append(item)
        for r in waiting:
            r.reply.set_exception(RequestError("the server is stopping", status=503, kind="server_error",
                                               code="server_stopping"))

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

    def authorized(self, header: str | None) -> bool:
        """Whether an `Authorization` header value carries this server's key (always, without one)."""
        if self.api_key is None:
            return True
        scheme, _, token = (header or "").partition(" ")
        # compare_digest: the time taken does not tell how much of a guess was right.
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.api_key.encode())


def _show(value) -> str:
    """A client's value for an error message, cut short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(request: dict, name: str, default: float, low: float, high: float, *, low_open: bool = False) -> float:
    value = request.get(name)
    if value is None:
        return default
    # (an int is finite however large; math.isfinite would overflow on 10**400)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or (isinstance(value, float)
                                                                           and not math.isfinite(value)):
        raise RequestError(f"'{name}' must be a finite number, got {_show(value)}", param=name)
    if value > high or value < low or (low_open and value == low):
        bounds = f"({low:g}, {high:g}]" if low_open else f"[{low:g}, {high:g}]"
        raise RequestError(f"'{name}' must be in {bounds}, got {_show(value)}", param=name)
    return float(value)


def _check_messages(messages) -> list[dict]:
    """The messages with each content a string (OpenAI's text parts joined); RequestError if
    not a non-empty list of {role, content} objects of known roles."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of {role, content} objects", param="messages")
    checked = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise RequestError(f"messages[{i}] must be an object with a 'role' of {', '.join(ROLES)}",
                               param=f"messages[{i}]")
        content = m.get("content")
        if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                             and isinstance(p.get("text"), str) for p in content):
            content = "".join(p["text"] for p in content)
        if not (isinstance(content, str) or (content is None and m["role"] == "assistant")):
            raise RequestError(f"messages[{i}].content must be a string (or a list of text parts)",
                               param=f"messages[{i}].content")
        checked.append({**m, "content": content})
    return checked


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


_ROUTES = {"POST": ("/v1/chat/completions", "/chat/completions"), "GET": ("/v1/models", "/models")}


def _handler(server: ChatServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a client's requests reuse one connection
        timeout = server.idle_timeout_s  # the socket's: a connection idle this long is closed
        _deadline: threading.Timer | None = None
        _timed_out = False
        _body_read = True  # False while a POST's body is unread: an answer then must close the connection

        def parse_request(self):
            # Called once a request line has arrived: the headers and body must follow within
            # request_timeout_s (a per-read timeout alone lets a client trickle bytes forever).
            self._body_read = False
            self._deadline = threading.Timer(server.request_timeout_s, self._time_out)
            self._deadline.daemon = True
            self._deadline.start()
            return super().parse_request()

        def _time_out(self):
            self._timed_out = self.close_connection = True
            log.info("chat server: %s sent no whole request within %gs; closing", self.client_address[0],
                     server.request_timeout_s)
            try:
                self.connection.shutdown(socket.SHUT_RDWR)  # wakes the handler's blocked read
            except OSError:
                pass

        def _request_read(self):
            if self._deadline is not None:
                self._deadline.cancel()

        def handle_one_request(self):
            try:
                super().handle_one_request()
            except (ConnectionError, TimeoutError) as e:  # the client went away or stalled
                log.info("chat server: connection from %s ended: %s", self.client_address[0], type(e).__name__)
                self.close_connection = True
            finally:
                self._request_read()

        def do_GET(self):  # noqa: N802 (http.server's naming)
            self._body_read = True
            if self._refused("GET"):
                return
            self._request_read()
            self._send(200, server.models())

        def do_POST(self):  # noqa: N802
            if self._refused("POST"):
                return
            try:
                body = parse_json(self._body())
                self._request_read()
                response = server.reply(body)
            except RequestError as e:
                return self._error(e)
            except (ConnectionError, TimeoutError):  # the client went away mid-request: one line, above
                raise
            except Exception as e:  # a failed generation is a 500 for this request, not a dead server
                if self._timed_out:
                    return
                log.exception("chat server: request failed")
                return self._send(500, error_body(f"{type(e).__name__}: {e}", kind="server_error"))
            if body.get("stream"):
                return self._stream(response)
            return self._send(200, response)

        def _refused(self, method: str) -> bool:
            """Answers (and returns True for) a request for no route or without the key."""
            if self.path.split("?")[0].rstrip("/") not in _ROUTES[method]:
                self._error(RequestError(f"no route {method} {self.path}", status=404, code="not_found"))
            elif not server.authorized(self.headers.get("Authorization")):
                self._error(RequestError("a valid API key is required: 'Authorization: Bearer KEY'", status=401,
                                         code="invalid_api_key"))
            else:
                return False
            return True

        def _body(self) -> bytes:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                raise RequestError("a chunked body is not supported: send Content-Length", status=411)
            length = self.headers.get("Content-Length")
            if length is None:
                raise RequestError("a request body with Content-Length is required", status=411)
            if not re.fullmatch(r"[0-9]{1,20}", length.strip()):
                raise RequestError(f"bad Content-Length {_show(length)}")
            if int(length) > server.max_body_bytes:
                raise RequestError(f"the request body of {length} bytes exceeds this server's "
                                   f"{server.max_body_bytes}", status=413, code="request_too_large")
            data = self.rfile.read(int(length))
            if len(data) < int(length):
                raise ConnectionResetError("the body ended early")
            self._body_read = True
            return data

        def send_error(self, code, message=None, explain=None):
            # http.server's own refusals (a bad request line, too many headers, an unknown
            # method) in OpenAI's shape too.
            self.close_connection = True
            self._send(code, error_body(message or self.responses.get(code, ("error",))[0]))

        def _error(self, e: RequestError):
            if not self._body_read:
                self.close_connection = True  # the body is unread: the connection cannot go on
            headers = {"Retry-After": "1"} if e.status == 429 else {}
            if e.status == 401:
                headers["WWW-Authenticate"] = "Bearer"
            self._send(e.status, e.body(), headers)

        def _send(self, code: int, obj: dict, headers: dict | None = None):
            if self._timed_out:
                return
            data = json.dumps(obj).encode()
            self._write(code, "application/json", data, headers or {})

        def _write(self, code: int, content_type: str, data: bytes, headers: dict):
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            if self.close_connection:
                self._drain()

        def _drain(self):
            # Closing a socket with unread bytes resets it, and the client may lose the answer
            # sent just before: end our side, then read (a bounded amount) until the client closes.
            try:
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_WR)
                self.connection.settimeout(1.0)
                deadline, drained = time.monotonic() + 2.0, 0
                while time.monotonic() < deadline and drained < 4 << 20:
                    data = self.connection.recv(1 << 16)
                    if not data:
                        break
                    drained += len(data)
            except OSError:
                pass

        def _stream(self, response: dict):
            events = [f"data: {json.dumps(c)}\n\n" for c in stream_chunks(response)] + ["data: [DONE]\n\n"]
            self._write(200, "text/event-stream", "".join(events).encode(), {})

        def log_message(self, fmt, *args):  # every request
            log.debug("chat server: " + fmt, *args)

        def log_error(self, fmt, *args):  # http.server's: a timed-out read, a refused request line
            log.info("chat server: %s: " + fmt, self.client_address[0], *args)
    return Handler
