"""tau2's user simulator wherever tau2 runs: `make_envs` serves the configured model with our
sampler in the trainer's process; pool workers and in-process envs both get their user turns
from it, with the configured sampling settings; closing the envs stops it."""

import urllib.error
import urllib.request

import pytest

from jaxscaffold import config as config_lib
from jaxscaffold.config import Tau2User
from jaxscaffold.envs.base import Observation
from jaxscaffold.models import config as model_config
from jaxscaffold.train import user_model

from tests.train.configs import load_config

tau2 = pytest.importorskip("jaxscaffold.envs.tau2")

# A random tiny model answers greedily with blank lines; sampled, it writes visible tokens.
USER = {"envs.tau2_user.preset": "tiny", "envs.tau2_user.compute_dtype": "float32",
        "envs.tau2_user.temperature": 1.0, "envs.tau2_user.max_tokens": 12,
        "envs.tau2_user.max_len": 2048, "envs.tau2_user.slots": 2}


def tau2_config(**overrides):
    cd = load_config("tiny", **{"envs.train": "tau2:retail/test:2", "envs.eval": "tau2:retail/test:2",
                                **USER, **overrides})
    return config_lib.from_configdict(cd)


def user_prompt(task) -> list[dict]:
    """The chat tau2's user simulator gets before the agent's first turn (recorded)."""
    got = []
    tau2.Tau2Env(user=lambda m: got.append(m) or "Hi.").reset(task)
    return got[0]


@pytest.mark.parametrize("workers", [1, 0], ids=["pool", "in_process"])
def test_tau2_users_are_served_by_the_configured_model(workers):
    from jaxscaffold.train.envs import make_envs
    cfg = tau2_config(**{"envs.num_workers": workers})
    tasks = tau2.catalogue("retail/test")[:2]
    envs = make_envs(cfg, {"tau2"})
    server = envs.server
    try:
        assert server.config == model_config.tiny(compute_dtype="float32") and (server.max_len, server.slots) == (2048, 2)
        before = sum(size * n for size, n in server.batch_sizes.items())  # requests served
        obs = envs.reset(tasks)
        assert all(isinstance(o, Observation) for o in obs), obs
        assert sum(size * n for size, n in server.batch_sizes.items()) == before + 2  # one user turn per episode, here
        # Each opening is the configured model's reply to tau2's user prompt for that task, at
        # the configured temperature, within max_tokens (request 1 was the warm-up; then the
        # episodes' requests, each seeded by its number as the server does: 2 and 3, in the
        # order they arrived, which a pool worker's concurrent env instances do not fix).
        def reply(task, number):
            ref = server.reply({"messages": user_prompt(task), "temperature": 1.0, "max_tokens": 12,
                                "seed": number})
            assert ref["usage"]["completion_tokens"] <= 12
            return ref["choices"][0]["message"]["content"]

        refs = {number: [reply(task, number) for task in tasks] for number in (2, 3)}
        assert [o.text for o in obs] in ([refs[2][0], refs[3][1]], [refs[3][0], refs[2][1]])
        assert all(o.text and o.privileged["has_user"] and not o.privileged["solo"] for o in obs)
        url = server.base_url
    finally:
        envs.close()
    with pytest.raises(urllib.error.URLError):  # closing the envs stopped the server
        urllib.request.urlopen(url + "/models", timeout=5)


def test_endpoint_and_no_user_modes_start_nothing():
    user, server = user_model.start_tau2_user(Tau2User(mode="endpoint", url="http://127.0.0.1:9/v1",
                                                       temperature=0.5, top_p=0.9, max_tokens=7))
    assert server is None and user.url == "http://127.0.0.1:9/v1/chat/completions"
    assert (user.temperature, user.top_p, user.max_tokens) == (0.5, 0.9, 7)
    assert user_model.start_tau2_user(Tau2User(mode="none")) == (None, None)


def test_the_start_up_summary_names_the_user():
    assert user_model.describe(Tau2User(preset="tiny", slots=2)) == (
        "preset tiny (random weights) served by our sampler in this process (2 slots), "
        "temperature 0, top_p 1, 1024 tokens a reply")
    assert user_model.describe(Tau2User(mode="endpoint", url="http://h:1/v1", max_tokens=9)).startswith(
        "the endpoint http://h:1/v1, temperature 0, top_p 1, 9 tokens")
    assert user_model.describe(Tau2User(mode="none")).startswith("none")


def test_an_hf_checkpoint_user_replies_as_the_preset_user_of_the_same_weights(tmp_path):
    """The hf_path branch: a local HF directory (written by our safetensors writer from the
    tiny preset's seeded weights, with the offline tokenizer's HF files; no hub) is served with
    the same replies as the preset itself for the same requests and seeds."""
    from jaxscaffold.models import hf_io
    from jaxscaffold.models.tokenizer import cached_hf_tokenizer_dir
    options = dict(compute_dtype="float32", max_len=2048, slots=2, seed=0)
    preset = user_model.serve(Tau2User(preset="tiny", **options))
    try:
        hf_io.save_pretrained(str(tmp_path / "user"), preset.config, preset.params,
                              tokenizer_dir=str(cached_hf_tokenizer_dir()), dtype="float32")
        served = user_model.serve(Tau2User(hf_path=str(tmp_path / "user"), **options))
        try:
            assert served.config == preset.config
            messages = user_prompt(tau2.catalogue("retail/test")[0])
            for seed in (1, 7):
                request = {"messages": messages, "temperature": 1.0, "max_tokens": 12, "seed": seed}
                a, b = (s.reply(dict(request))["choices"][0]["message"]["content"] for s in (served, preset))
                assert a == b and a
        finally:
            served.stop()
    finally:
        preset.stop()
