"""configs/rwml_tau2.py: every tau2 domain's agent system prompt, with a collecting episode's
minimum budget after it, fits the configured rollout.max_len (8,192 left telecom ~1k tokens)."""

import os

import pytest

pytest.importorskip("tau2")

from jaxscaffold import config as config_lib  # noqa: E402
from jaxscaffold.envs import registry  # noqa: E402
from jaxscaffold.envs.tau2 import DOMAINS, Tau2Env  # noqa: E402
from jaxscaffold.models.chat import Qwen3ChatRenderer  # noqa: E402
from jaxscaffold.models.tokenizer import load_tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EPISODE_BUDGET = 8192  # tokens after the first prompt: 15 collecting turns of ~500 tokens


def _first_prompt_tokens(chat, task, user) -> int:
    obs = Tau2Env(user=user).reset(task)
    return len(chat.render([{"role": "system", "content": obs.system_prompt},
                            {"role": "user", "content": obs.text}], add_generation_prompt=True))


def test_every_domains_system_prompt_and_an_episode_fit_max_len():
    cd = config_lib.load_file(os.path.join(ROOT, "configs", "rwml_tau2.py"))
    cfg = config_lib.from_configdict(config_lib.parse_overrides(cd, ["envs.tau2_user.hf_path=/ckpt/Qwen3-8B"]))
    chat = Qwen3ChatRenderer(load_tokenizer(None))
    tasks = registry.catalogue("tau2", "train")
    for domain in DOMAINS:
        task = next(t for t in tasks if t.category == domain)
        longest = max(_first_prompt_tokens(chat, task, user) for user in (lambda m: "Hi, I need help.", None))
        assert longest > 4000, domain  # the prompt really holds tau2's policy and tool schemas
        assert longest + EPISODE_BUDGET + cfg.rollout.max_new_tokens <= cfg.rollout.max_len, (domain, longest)
