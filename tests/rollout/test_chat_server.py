"""The loopback chat endpoint: OpenAI-shaped replies from our sampler, greedy = the sampler's
own greedy output, bad requests answered 400 in OpenAI's error shape, the compiled samplers
bounded, the API key enforced; tau2's user-simulator client talks to it. (Hostile clients:
tests/faults/test_chat_server_hostile.py.)"""

import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import jax
import pytest

from jaxscaffold.models import config as model_config, qwen3
from jaxscaffold.models.chat import Qwen3ChatRenderer
from jaxscaffold.models.tokenizer import QwenOfflineTokenizer
from jaxscaffold.rollout.chat_server import ChatServer, RequestError, check_limits, is_loopback
from jaxscaffold.rollout.engine import Sampler, SamplerOptions
from jaxscaffold.rollout.sampling import GREEDY
from jaxscaffold.rollout.conversation import MultiTurn

CONFIG = model_config.tiny()


@pytest.fixture(scope="module")
def server():
    params = qwen3.init_params(CONFIG, jax.random.key(1))
    with ChatServer(CONFIG, params, QwenOfflineTokenizer(), max_len=256, slots=4, batch_window_s=0.2) as s:
        yield s


def _alone(params, messages, max_tokens):
    """The reply a batch-1 sampler gives a request on its own (greedy)."""
    tok = QwenOfflineTokenizer()
    ids = Qwen3ChatRenderer(tok).render(messages, add_generation_prompt=True, enable_thinking=False)
    mt = MultiTurn(Sampler(CONFIG, stop_ids=tok.eos_ids, batch_size=1, max_len=256,
                           options=SamplerOptions(sampling=GREEDY)))
    mt.extend(params, {0: ids})
    gen = mt.generate(params, [0], max_new_tokens=max_tokens, seeds=[0])[0]
    return tok.decode([t for t in gen.tokens if t not in tok.eos_ids]).strip()


def _post(url, body, headers=None):
    req = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _refusal(call) -> tuple[int, dict]:
    """(status, OpenAI error object) of a call that must fail with an HTTP error."""
    with pytest.raises(urllib.error.HTTPError) as e:
        call()
    error = json.loads(e.value.read())["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return e.value.code, error


def test_greedy_reply_equals_the_sampler(server):
    messages = [{"role": "user", "content": "Hello, I need to change my order."}]
    out = _post(server.base_url, {"messages": messages, "temperature": 0, "max_tokens": 8})
    assert out["object"] == "chat.completion" and out["usage"]["completion_tokens"] <= 8
    tok = QwenOfflineTokenizer()
    ids = Qwen3ChatRenderer(tok).render(messages, add_generation_prompt=True, enable_thinking=False)
    mt = MultiTurn(Sampler(CONFIG, stop_ids=tok.eos_ids, batch_size=1, max_len=256,
                           options=SamplerOptions(sampling=GREEDY)))
    mt.extend(server.params, {0: ids})
    gen = mt.generate(server.params, [0], max_new_tokens=8, seeds=[0])[0]
    expected = tok.decode([t for t in gen.tokens if t not in tok.eos_ids])
    assert out["choices"][0]["message"]["content"] == expected.strip()


def test_concurrent_requests_are_batched_and_answered_as_alone(server):
    """Four clients at once: one generation batch serves them (the window gathers them), and
    each reply is the one its request gets alone, its own max_tokens included."""
    asks = [([{"role": "user", "content": f"Request number {i}: {'please ' * i}help."}], 4 + 2 * i)
            for i in range(4)]
    before = sum(server.batch_sizes.values())
    results = [None] * 4

    def ask(i):
        results[i] = _post(server.base_url, {"messages": asks[i][0], "temperature": 0, "max_tokens": asks[i][1]})

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sum(server.batch_sizes.values()) - before < 4 and max(server.batch_sizes) > 1
    for (messages, max_tokens), out in zip(asks, results):
        assert out["usage"]["completion_tokens"] <= max_tokens
        assert out["choices"][0]["message"]["content"] == _alone(server.params, messages, max_tokens)


def test_models_route_and_streaming(server):
    with urllib.request.urlopen(server.base_url + "/models", timeout=30) as r:
        models = json.loads(r.read())
    assert models["data"][0]["id"] == server.model_name and models["object"] == "list"
    body = {"messages": [{"role": "user", "content": "Stream this."}], "temperature": 0, "max_tokens": 6}
    plain = _post(server.base_url, body)
    req = urllib.request.Request(server.base_url + "/chat/completions", data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.headers["Content-Type"] == "text/event-stream"
        events = [line[len("data: "):] for line in r.read().decode().split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == plain["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]


@pytest.mark.slow  # two subprocesses that import JAX and compile: 25-40 s on a loaded machine
def test_serve_chat_serves_a_random_tiny_model(tmp_path):
    """`launch/serve_chat.py --preset tiny`: the API without a checkpoint; a bad preset is one
    line; JAXSCAFFOLD_API_KEY in its environment is required of every request."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = os.path.join(root, "launch", "serve_chat.py")
    bad = subprocess.run([sys.executable, script, "--preset", "qwen9"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: unknown Qwen3 preset") and bad.stderr.count("\n") == 1
    bad = subprocess.run([sys.executable, script, "--preset", "tiny", "--request-timeout", "nan"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: request_timeout_s") and bad.stderr.count("\n") == 1
    proc = subprocess.Popen([sys.executable, script, "--preset", "tiny", "--port", "0", "--dtype", "float32",
                             "--max-len", "128", "--slots", "2"], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "JAXSCAFFOLD_API_KEY": "test-key"})
    try:
        line = proc.stdout.readline()
        url = line.split(" on ", 1)[1].split("/chat/completions")[0]
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        assert _refusal(lambda: _post(url, body))[0] == 401
        out = _post(url, body, {"Authorization": "Bearer test-key"})
        assert out["choices"][0]["message"]["role"] == "assistant" and out["usage"]["completion_tokens"] <= 3
    finally:
        proc.terminate()
        proc.wait(30)


def test_bad_requests_get_400(server):
    hi = [{"role": "user", "content": "hi"}]
    for body, param in (({"messages": "hi"}, "messages"), ({"messages": []}, "messages"),
                        ({"messages": [{"role": 1, "content": "x"}]}, "messages[0]"),
                        ({"messages": [{"role": "user", "content": "x " * 400}]}, "messages"),
                        ({"messages": hi, "temperature": -0.5}, "temperature"),
                        ({"messages": hi, "top_p": 0}, "top_p"),
                        ({"messages": hi, "max_tokens": 0}, "max_tokens"),
                        ({"messages": hi, "max_tokens": 10**9}, "max_tokens")):
        status, error = _refusal(lambda body=body: _post(server.base_url, body))
        assert status == 400 and error["param"] == param and error["type"] == "invalid_request_error"
    status, error = _refusal(lambda: _post(server.base_url, {"model": "gpt-9", "messages": hi}))
    assert status == 404 and error["code"] == "model_not_found"


def test_sampling_settings_are_bucketed_and_bounded():
    """Temperatures on one grid point share a program; past `max_sampling_settings` distinct
    points a new one is refused (JAX keeps every compiled program: this count bounds them),
    and the Sampler objects held stay within `max_samplers` however many were asked for."""
    params = qwen3.init_params(CONFIG, jax.random.key(2))
    with ChatServer(CONFIG, params, QwenOfflineTokenizer(), max_len=64, slots=2, max_sampling_settings=2,
                    max_samplers=1) as s:
        hi = [{"role": "user", "content": "hi"}]
        assert s.check({"messages": hi, "temperature": 0.52, "top_p": 0.93})[1] == (0.5, 0.95)
        assert s.check({"messages": hi, "temperature": 0.04, "top_p": 0.5})[1] == (0.0, 1.0)  # greedy
        for temperature in (0.5, 0.52, 0.48, 0.7):  # two grid points
            assert _post(s.base_url, {"messages": hi, "temperature": temperature, "max_tokens": 2})["object"] \
                == "chat.completion"
        for temperature in (0.9, 1.1, 1.3, 1.5, 1.7, 1.9, 0.2, 0.3):
            status, error = _refusal(lambda t=temperature: _post(s.base_url, {"messages": hi, "temperature": t,
                                                                "max_tokens": 2}))
            assert status == 400 and error["code"] == "unsupported_sampling" and "0.5" in error["message"]
        assert s.sampler_count == 1
        assert _post(s.base_url, {"messages": hi, "temperature": 0.5, "max_tokens": 2})["object"] == "chat.completion"
        assert s.sampler_count == 1


def test_api_key_is_required_when_set(caplog):
    caplog.set_level(logging.WARNING, logger="jaxscaffold.rollout.chat_server")
    params = qwen3.init_params(CONFIG, jax.random.key(2))
    with ChatServer(CONFIG, params, QwenOfflineTokenizer(), max_len=64, slots=1, api_key="s3cret") as s:
        models = urllib.request.Request(s.base_url + "/models")
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"},
                        {"Authorization": "Basic s3cret"}, {"Authorization": "Bearer s3cret0"}):
            status, error = _refusal(lambda h=headers: urllib.request.urlopen(
                urllib.request.Request(s.base_url + "/models", headers=h), timeout=30))
            assert status == 401 and error["code"] == "invalid_api_key"
        status, _ = _refusal(lambda: _post(s.base_url, {"messages": [{"role": "user", "content": "hi"}]}))
        assert status == 401
        models.add_header("Authorization", "Bearer s3cret")
        with urllib.request.urlopen(models, timeout=30) as r:
            assert json.loads(r.read())["data"][0]["id"] == s.model_name
    assert not caplog.records  # loopback: no warning


def test_stop_refuses_the_requests_still_waiting():
    """Requests queued behind a running generation when the server stops get a 503 error,
    not a wait without end; the one generating finishes."""
    params = qwen3.init_params(CONFIG, jax.random.key(2))
    s = ChatServer(CONFIG, params, QwenOfflineTokenizer(), max_len=64, slots=1, batch_window_s=0.0).start()
    ask = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 4}
    running = s.submit(ask)
    while not s.sampler_count:  # the generation thread has taken it (and compiles)
        time.sleep(0.01)
    waiting = [s.submit(ask), s.submit(ask)]
    s.stop()
    assert running.result(120)["object"] == "chat.completion"
    for future in waiting:
        error = future.exception(120)
        assert isinstance(error, RequestError) and error.status == 503
        assert error.body()["error"]["code"] == "server_stopping"


def test_bad_limits_are_refused_by_name():
    good = {"max_len": 128, "slots": 2, "batch_window_s": 0.01, "max_tokens_cap": None, "max_queue": 4,
            "max_sampling_settings": 2, "max_samplers": 1, "max_body_bytes": 1024, "request_timeout_s": 1.0,
            "idle_timeout_s": 1.0, "backlog": 128}
    assert check_limits(**good) == 127 and check_limits(**{**good, "max_tokens_cap": 100}) == 100
    for name, value in (("max_queue", 0), ("slots", 2.0), ("backlog", True), ("max_tokens_cap", 128),
                        ("idle_timeout_s", float("nan")), ("request_timeout_s", 0), ("batch_window_s", float("inf")),
                        ("max_len", 1)):
        with pytest.raises(ValueError, match=name):
            check_limits(**{**good, name: value})


def test_non_loopback_addresses_are_recognised():
    """The warning for a server others can reach keys on this (tests bind loopback only)."""
    assert all(map(is_loopback, ("127.0.0.1", "127.8.9.1", "::1", "localhost")))
    assert not any(map(is_loopback, ("0.0.0.0", "::", "10.1.2.3", "192.168.0.7", "example.com", "")))


@pytest.mark.slow  # a max_len 8192 server compiles its programs: about 25 s
def test_tau2_user_simulator_is_served_by_our_sampler(server):
    """A tau2 retail episode whose user is the endpoint, through the client a config builds
    (`train.user_model.client`: a ChatEndpointUser with the config's settings): the user's
    opening message is our model's reply to tau2's user prompt. A few sampled tokens: the
    random model's greedy reply to that prompt strips to nothing (at 8 and 64 tokens), which
    tau2 refuses, and tau2's default of 1024 outlasts the client's timeout on a loaded CPU."""
    tau2 = pytest.importorskip("jaxscaffold.envs.tau2")
    user = tau2.ChatEndpointUser(server.base_url, max_tokens=4, temperature=0.0)
    assert isinstance(user([{"role": "user", "content": "Hi"}]), str)
    big = ChatServer(server.config, server.params, server.tokenizer, max_len=8192).start()
    try:
        env = tau2.Tau2Env(user=tau2.ChatEndpointUser(big.base_url, max_tokens=16, temperature=1.0))
        before = big._requests
        obs = env.reset(tau2.catalogue("retail/test")[0])
        assert big._requests == before + 1 and not obs.privileged["solo"]
        env.close()
    finally:
        big.stop()
