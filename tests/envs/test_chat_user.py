"""ChatEndpointUser against a scripted HTTP endpoint on 127.0.0.1: the API key travels as a
Bearer header, and a full server's 429 is retried after its Retry-After (a bounded number of times)."""

import http.server
import json
import threading

import pytest

from jaxscaffold.envs.chat_user import ChatEndpointUser


def _serve(statuses: list[int], seen: list[dict]):
    """A server answering each POST with the next status of `statuses` (200: a chat reply)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(dict(self.headers))
            status = statuses.pop(0)
            body = json.dumps({"choices": [{"message": {"content": "hi"}}]} if status == 200 else {"error": {}}).encode()
            self.send_response(status)
            if status == 429:
                self.send_header("Retry-After", "0")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("key", ["secret", None])
def test_key_is_sent_and_429_is_retried(key, monkeypatch):
    monkeypatch.delenv("JAXSCAFFOLD_API_KEY", raising=False)
    seen: list[dict] = []
    server = _serve([429, 429, 200], seen)
    try:
        user = ChatEndpointUser(f"http://127.0.0.1:{server.server_address[1]}/v1", api_key=key)
        assert user([{"role": "user", "content": "x"}]) == "hi"
    finally:
        server.shutdown()
    assert len(seen) == 3
    assert all(h.get("Authorization") == (f"Bearer {key}" if key else None) for h in seen)


def test_key_from_the_environment_and_retries_bounded(monkeypatch):
    monkeypatch.setenv("JAXSCAFFOLD_API_KEY", "k2")
    seen: list[dict] = []
    server = _serve([429] * 3, seen)
    try:
        user = ChatEndpointUser(f"http://127.0.0.1:{server.server_address[1]}/v1", retries=2)
        with pytest.raises(Exception, match="429"):
            user([{"role": "user", "content": "x"}])
    finally:
        server.shutdown()
    assert len(seen) == 3 and seen[0]["Authorization"] == "Bearer k2"
