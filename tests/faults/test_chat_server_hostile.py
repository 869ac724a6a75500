"""The chat server against hostile clients (on 127.0.0.1 only): every bad request is a 4xx in
OpenAI's error shape, never a 500; 200 connections at once are all answered (200 or 429),
none reset; stalled and idle connections are closed after their timeouts; a client that hangs
up mid-stream costs one log line, no traceback."""

import http.client
import json
import logging
import socket
import struct
import threading
import time

import jax
import pytest

from jaxscaffold.models import config as model_config, qwen3
from jaxscaffold.models.tokenizer import QwenOfflineTokenizer
from jaxscaffold.rollout.chat_server import ChatServer

CONFIG = model_config.tiny()
HI = [{"role": "user", "content": "hi"}]
LOGGER = "jaxscaffold.rollout.chat_server"


@pytest.fixture(scope="module")
def server():
    params = qwen3.init_params(CONFIG, jax.random.key(3))
    with ChatServer(CONFIG, params, QwenOfflineTokenizer(), max_len=128, slots=4, max_queue=8,
                    max_body_bytes=1 << 20, request_timeout_s=1.5, idle_timeout_s=1.5, batch_window_s=0.05) as s:
        s.reply({"messages": HI, "temperature": 0, "max_tokens": 1})  # compiles the greedy programs once
        yield s


def _exchange(server, data: bytes, timeout: float = 60):
    """Sends raw bytes on a fresh connection; (status, headers, body) of the answer."""
    with socket.create_connection(server.httpd.server_address[:2], timeout=timeout) as sock:
        sock.sendall(data)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, dict(response.getheaders()), response.read()


def _post(server, body: bytes, headers: str = ""):
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{headers}\r\n").encode()
    return _exchange(server, head + body)


def _assert_openai_error(status, body, expected_status, param=None, code=None):
    assert status == expected_status, body
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str)
    assert error["message"] and "\n" not in error["message"] and len(error["message"]) < 300
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


# (what it is, the body's bytes, status, param) for the issue's hostile requests and their kin.
LONG = json.dumps({"messages": [{"role": "user", "content": "word " * 400}]}).encode()
HOSTILE = [
    ("NaN literal", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', 400, None),
    ("Infinity literal", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}', 400, None),
    ("an integer temperature of 401 digits", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1'
     + b"0" * 400 + b"}", 400, "temperature"),
    ("1e400 overflows to inf", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e400}', 400,
     "temperature"),
    ("negative temperature", json.dumps({"messages": HI, "temperature": -1}).encode(), 400, "temperature"),
    ("string temperature", json.dumps({"messages": HI, "temperature": "hot"}).encode(), 400, "temperature"),
    ("boolean temperature", json.dumps({"messages": HI, "temperature": True}).encode(), 400, "temperature"),
    ("temperature above 2", json.dumps({"messages": HI, "temperature": 2.5}).encode(), 400, "temperature"),
    ("top_p 0", json.dumps({"messages": HI, "top_p": 0}).encode(), 400, "top_p"),
    ("top_p 1.5", json.dumps({"messages": HI, "top_p": 1.5}).encode(), 400, "top_p"),
    ("max_tokens 0", json.dumps({"messages": HI, "max_tokens": 0}).encode(), 400, "max_tokens"),
    ("max_tokens 1e9", json.dumps({"messages": HI, "max_tokens": 10**9}).encode(), 400, "max_tokens"),
    ("max_tokens 1e9 as a float", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e9}', 400,
     "max_tokens"),
    ("max_tokens a list", json.dumps({"messages": HI, "max_tokens": [1] * 10000}).encode(), 400, "max_tokens"),
    ("n 3", json.dumps({"messages": HI, "n": 3}).encode(), 400, "n"),
    ("empty messages", json.dumps({"messages": []}).encode(), 400, "messages"),
    ("no messages", json.dumps({"temperature": 0}).encode(), 400, "messages"),
    ("messages a string", json.dumps({"messages": "hi"}).encode(), 400, "messages"),
    ("unknown role", json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(), 400, "messages[0]"),
    ("numeric role", json.dumps({"messages": [{"role": 1, "content": "x"}]}).encode(), 400, "messages[0]"),
    ("numeric content", json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(), 400,
     "messages[0].content"),
    ("prompt over max_len", LONG, 400, "messages"),
    ("a list body", b"[1, 2]", 400, None),
    ("malformed JSON", b'{"messages": [', 400, None),
    ("100k-deep JSON", b"[" * 100_000 + b"]" * 100_000, 400, None),
    ("100k-deep JSON object", b'{"a":' * 100_000 + b"1" + b"}" * 100_000, 400, None),
    ("bad UTF-8", b'{"messages": "\xff\xfe"}', 400, None),
    ("a 5000-digit integer", b'{"messages": [{"role": "user", "content": "hi"}], "seed": ' + b"9" * 5000 + b"}",
     400, None),
]


@pytest.mark.parametrize("what,body,status,param", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_request_is_refused_in_openai_shape(server, what, body, status, param):
    code, _, reply = _post(server, body)
    _assert_openai_error(code, reply, status, param)


def test_unknown_model_is_model_not_found_and_known_names_are_served(server):
    code, _, reply = _post(server, json.dumps({"model": "gpt-9", "messages": HI}).encode())
    _assert_openai_error(code, reply, 404, "model", "model_not_found")
    for name in (server.model_name, "default"):  # "default": what jaxscaffold's own client sends
        code, _, reply = _post(server, json.dumps({"model": name, "messages": HI, "temperature": 0,
                                                   "max_tokens": 1}).encode())
        assert code == 200 and json.loads(reply)["usage"]["completion_tokens"] <= 1


def test_bad_framing_gets_4xx_not_500(server):
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
    status, headers, reply = _exchange(server, f"{head}Content-Length: 1000000000000\r\n\r\n{{".encode())
    _assert_openai_error(status, reply, 413, code="request_too_large")
    assert headers["Connection"] == "close"
    big = json.dumps({"messages": [{"role": "user", "content": "x" * (1100 << 10)}]}).encode()
    _assert_openai_error(*_post(server, big)[::2], 413)
    _assert_openai_error(*_exchange(server, f"{head}Content-Length: -5\r\n\r\n".encode())[::2], 400)
    _assert_openai_error(*_exchange(server, f"{head}Content-Length: 1e3\r\n\r\n".encode())[::2], 400)
    _assert_openai_error(*_exchange(server, f"{head}Content-Length: \xb2\r\n\r\n".encode("latin-1"))[::2], 400)
    _assert_openai_error(*_exchange(server, f"{head}\r\n".encode())[::2], 411)
    _assert_openai_error(*_exchange(server, f"{head}Transfer-Encoding: chunked\r\n\r\n2\r\n{{}}\r\n0\r\n\r\n"
                                    .encode())[::2], 411)
    _assert_openai_error(*_exchange(server, b"BREW /v1/chat/completions HTTP/1.1\r\nHost: t\r\n\r\n")[::2], 501)
    _assert_openai_error(*_exchange(server, b"GET /v1/secrets HTTP/1.1\r\nHost: t\r\n\r\n")[::2], 404)


def test_200_concurrent_connections_are_all_answered(server):
    """200 clients connect at once: each gets 200 or 429 (with Retry-After), none is reset or
    left hanging; the queue bound (8) is what refuses the rest."""
    assert server.httpd.request_queue_size >= 128
    body = json.dumps({"messages": HI, "temperature": 0, "max_tokens": 1}).encode()
    outcomes = [None] * 200
    start = threading.Barrier(200, timeout=60)

    def client(i):
        try:
            start.wait()
            status, headers, reply = _post(server, body)
            outcomes[i] = (status, headers.get("Retry-After"), json.loads(reply))
        except Exception as e:  # a reset or a timeout: what must not happen
            outcomes[i] = (type(e).__name__, None, None)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(200)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(1.0, 240 - (time.monotonic() - t0)))
    statuses = [o[0] if o else "unanswered" for o in outcomes]
    assert set(statuses) <= {200, 429}, sorted(set(map(str, statuses)))
    assert 200 in statuses and 429 in statuses
    for status, retry_after, reply in outcomes:
        if status == 429:
            assert retry_after == "1"
            _assert_openai_error(429, json.dumps(reply), 429, code="server_busy")
        else:
            assert reply["object"] == "chat.completion"


def test_idle_and_half_sent_connections_are_closed(server):
    """An idle connection, a half-sent request and one trickled a byte at a time (each byte
    inside the idle timeout) are all closed, within the timeouts and not later."""
    address = server.httpd.server_address[:2]

    def closed_after(send):
        with socket.create_connection(address, timeout=30) as sock:
            t0 = time.monotonic()
            send(sock)
            sock.settimeout(30)
            assert sock.recv(1024) == b""  # closed by the server, not answered
            return time.monotonic() - t0

    assert 1.0 < closed_after(lambda sock: None) < 10
    assert 1.0 < closed_after(lambda sock: sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Le")) < 10
    assert 1.0 < closed_after(lambda sock: sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 100"
                                                       b"\r\n\r\n{\"messages\"")) < 10

    def trickle(sock):
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n")
        for _ in range(40):  # 20 s at most if nothing closed it
            try:
                sock.sendall(b"X")
            except OSError:  # closed under us: what the test waits for
                return
            time.sleep(0.5)
    assert closed_after(trickle) < 10


def test_stream_client_hanging_up_logs_one_line_no_traceback(server, caplog, capfd):
    caplog.set_level(logging.INFO, logger=LOGGER)
    body = json.dumps({"messages": HI, "temperature": 0, "max_tokens": 64, "stream": True}).encode()
    for _ in range(3):
        sock = socket.create_connection(server.httpd.server_address[:2], timeout=30)
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n"
                     .encode() + body)
        time.sleep(0.2)  # the server has read the request and is generating
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # a reset: the server's write of the stream fails
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and sum("ended" in r.getMessage() for r in caplog.records) < 3:
        time.sleep(0.1)
    ended = [r for r in caplog.records if "ended" in r.getMessage()]
    assert len(ended) == 3 and all(r.levelno == logging.INFO for r in ended)
    assert not any(r.exc_info for r in caplog.records)
    assert "Traceback" not in capfd.readouterr().err
    assert _post(server, json.dumps({"messages": HI, "temperature": 0, "max_tokens": 1}).encode())[0] == 200
