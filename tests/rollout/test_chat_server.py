"""The loopback chat endpoint: OpenAI-shaped replies from our sampler, greedy = the sampler's
own greedy output, bad requests answered 400; tau2's user-simulator client talks to it."""

import json
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
    with ChatServer(CONFIG, params, QwenOfflineTokenizer(), max_len=256) as s:
        yield s


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
    mt = MultiTurn(Sampler(CONFIG, batch_size=1, max_len=256, sampling=GREEDY))
    mt.extend(server.params, {0: ids})
    gen = mt.generate(server.params, [0], max_new_tokens=8, seeds=[0])[0]
    expected = tok.decode([t for t in gen.tokens if t not in tok.eos_ids])
    assert out["choices"][0]["message"]["content"] == expected.strip()


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
