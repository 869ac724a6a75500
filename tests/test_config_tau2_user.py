"""tau2's user simulator in the config: a run with tau2 names one (or opts out), in one way;
each bad setting is one line naming the field."""

import os

import pytest

from jaxscaffold import config as config_lib
from jaxscaffold.config import ConfigError
from jaxscaffold.train import config_checks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(*overrides):
    cd = config_lib.load_file(os.path.join(ROOT, "configs", "base.py"))
    return config_checks.checked(config_lib.parse_overrides(cd, list(overrides)))


@pytest.mark.parametrize("field", ["envs.train", "envs.eval"])
def test_tau2_without_a_user_model_fails_in_one_line_unless_opted_out(field):
    with pytest.raises(ConfigError) as e:
        build(f"{field}=tau2:retail/test")
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"config.{field}=") and "envs.tau2_user.hf_path" in message
    assert "mode='none'" in message
    assert build(f"{field}=tau2", "envs.tau2_user.mode=none").envs.tau2_user.mode == "none"
    assert build(f"{field}=tau2", "envs.tau2_user.preset=tiny").envs.tau2_user.preset == "tiny"
    assert build(f"{field}=tau2", "envs.tau2_user.hf_path=/ckpt/Qwen3-8B").envs.tau2_user.hf_path
    endpoint = build(f"{field}=tau2", "envs.tau2_user.mode=endpoint", "envs.tau2_user.url=http://127.0.0.1:8011/v1")
    assert endpoint.envs.tau2_user.url.endswith("/v1")
    assert build().envs.tau2_user.mode == "model"  # no tau2: nothing to name


@pytest.mark.parametrize("overrides, match", [
    (["envs.tau2_user.mode=nobody"], "envs.tau2_user.mode='nobody' is not one of: model, endpoint, none"),
    (["envs.tau2_user.compute_dtype=bf16"], "envs.tau2_user.compute_dtype='bf16' is not one of"),
    (["envs.tau2_user.preset=qwen9"], "envs.tau2_user.preset='qwen9' is not one of: tiny, qwen3-0.6b"),
    (["envs.tau2_user.preset=tiny", "envs.tau2_user.hf_path=/x"], "serves one model: hf_path or preset"),
    (["envs.tau2_user.url=http://h/v1"], "mode='model' serves one model"),
    (["envs.tau2_user.mode=endpoint"], "mode='endpoint' needs url"),
    (["envs.tau2_user.mode=endpoint", "envs.tau2_user.url=h:80"], "mode='endpoint' needs url"),
    (["envs.tau2_user.mode=endpoint", "envs.tau2_user.url=http://h/v1", "envs.tau2_user.preset=tiny"],
     "and no model"),
    (["envs.tau2_user.mode=none", "envs.tau2_user.hf_path=/x"], "mode='none' runs without a user: clear hf_path"),
    (['envs.env_kwargs={"tau2": {"user": "http://h/v1"}}'], "configure it in envs.tau2_user instead"),
    (["envs.tau2_user.temperature=-0.1"], "envs.tau2_user.temperature=-0.1 must be >= 0.0"),
    (["envs.tau2_user.top_p=0"], "envs.tau2_user.top_p=0.0 must be > 0.0 and <= 1.0"),
    (["envs.tau2_user.max_tokens=0"], "envs.tau2_user.max_tokens=0 must be >= 1"),
    (["envs.tau2_user.slots=0"], "envs.tau2_user.slots=0 must be >= 1"),
    (["envs.tau2_user.timeout_s=0"], "envs.tau2_user.timeout_s=0.0 must be > 0.0"),
    (["envs.tau2_user.max_len=512", "envs.tau2_user.max_tokens=512"], "max_len=512 must exceed"),
])
def test_bad_user_settings_are_one_line(overrides, match):
    with pytest.raises(ConfigError, match=match.replace("(", r"\(").replace(".", r"\.")) as e:
        build("envs.train=tau2", *overrides)
    assert "\n" not in str(e.value)


def test_configs_written_before_the_section_load_with_its_defaults():
    d = build().to_dict()
    del d["envs"]["tau2_user"]
    assert config_lib.from_dict(d).envs.tau2_user == config_lib.Tau2User()
    assert config_lib.Tau2User() == build().envs.tau2_user  # base.py's defaults are the dataclass's


def test_the_launcher_refuses_tau2_without_a_user_at_start():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "tpu_train.py"), "--config", "tiny.py",
                          "--config.envs.train=tau2:retail/train"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr[-2000:]
    assert "envs.tau2_user.hf_path" in out.stderr and "mode='none'" in out.stderr
