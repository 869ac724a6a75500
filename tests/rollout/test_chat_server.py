"""The loopback chat endpoint: OpenAI-shaped replies from our sampler, greedy = the sampler's
own greedy output, bad requests answered 400; tau2's user-simulator client talks to it."""

import json
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
from jaxscaffold.rollout.chat_server import ChatServer
from jaxscaffold.rollout.engine import Sampler
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
    mt = MultiTurn(Sampler(CONFIG, stop_ids=tok.eos_ids, batch_size=1, max_len=256, sampling=GREEDY))
    mt.extend(params, {0: ids})
    gen = mt.generate(params, [0], max_new_tokens=max_tokens, seeds=[0])[0]
    return tok.decode([t for t in gen.tokens if t not in tok.eos_ids]).strip()


def _post(url, body):
    req = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def test_greedy_reply_equals_the_sampler(server):
    messages = [{"role": "user", "content": "Hello, I need to change my order."}]
    out = _post(server.base_url, {"messages": messages, "temperature": 0, "max_tokens": 8})
    assert out["object"] == "chat.completion" and out["usage"]["completion_tokens"] <= 8
    tok = QwenOfflineTokenizer()
    ids = Qwen3ChatRenderer(tok).render(messages, add_generation_prompt=True, enable_thinking=False)
    mt = MultiTurn(Sampler(CONFIG, stop_ids=tok.eos_ids, batch_size=1, max_len=256, sampling=GREEDY))
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


def test_serve_chat_serves_a_random_tiny_model(tmp_path):
    """`launch/serve_chat.py --preset tiny`: the API without a checkpoint; a bad preset is one line."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = os.path.join(root, "launch", "serve_chat.py")
    bad = subprocess.run([sys.executable, script, "--preset", "qwen9"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: unknown Qwen3 preset") and bad.stderr.count("\n") == 1
    proc = subprocess.Popen([sys.executable, script, "--preset", "tiny", "--port", "0", "--dtype", "float32",
                             "--max-len", "128", "--slots", "2"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = line.split(" on ", 1)[1].split("/chat/completions")[0]
        out = _post(url, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert out["choices"][0]["message"]["role"] == "assistant" and out["usage"]["completion_tokens"] <= 3
    finally:
        proc.terminate()
        proc.wait(30)


def test_bad_requests_get_400(server):
    for body in ({"messages": "hi"}, {"messages": [{"role": 1, "content": "x"}]},
                 {"messages": [{"role": "user", "content": "x " * 400}]}):
        with pytest.raises(urllib.error.HTTPError) as e:
            _post(server.base_url, body)
        assert e.value.code == 400


def test_tau2_user_simulator_is_served_by_our_sampler(server):
    """A tau2 retail episode whose user is the endpoint (given by URL, as a config would):
    the user's opening message is our model's greedy reply to tau2's user prompt."""
    tau2 = pytest.importorskip("jaxscaffold.envs.tau2")
    user = tau2.ChatEndpointUser(server.base_url, max_tokens=4, temperature=0.0)
    assert isinstance(user([{"role": "user", "content": "Hi"}]), str)
    big = ChatServer(server.config, server.params, server.tokenizer, max_len=8192).start()
    try:
        env = tau2.Tau2Env(user=big.base_url)
        before = big._requests
        obs = env.reset(tau2.catalogue("retail/test")[0])
        assert big._requests == before + 1 and not obs.privileged["solo"]
        env.close()
    finally:
        big.stop()
