"""The `lora` section: declared in configs/base.py, its values checked in one line each."""

import pytest

from jaxscaffold import config as config_lib
from jaxscaffold.config import ConfigError
from jaxscaffold.models import lora
from jaxscaffold.train.job import lora_config
from tests.test_config import base, build, rwml


def test_lora_is_off_by_default_and_parsed_when_on():
    assert lora_config(build(base()).lora) is None
    cfg = build(base(), "lora.rank=8", "lora.alpha=32", "lora.targets=q, v,down", "lora.base_dtype=float32")
    assert lora_config(cfg.lora) == lora.LoraConfig(rank=8, alpha=32.0, targets=("q", "v", "down"))
    d = cfg.to_dict()
    del d["lora"]  # a config written before LoRA existed (an older checkpoint's): off
    assert config_lib.from_dict(d).lora is None


@pytest.mark.parametrize("override, match", [
    ("lora.rank=-1", r"config.lora.rank=-1 must be >= 0"),
    ("lora.alpha=0", r"config.lora.alpha=0.0 must be > 0.0"),
    ("lora.targets=q,lm_head", r"config.lora.targets='lm_head' is not one of: q, k, v, o, gate, up, down"),
    ("lora.targets= , ", r"config.lora.targets=' , ' names no matrix"),
    ("lora.base_dtype=int8", r"config.lora.base_dtype='int8' is not one of: float32, bfloat16, float16"),
])
def test_bad_lora_fields_are_one_line_errors(override, match):
    with pytest.raises(ConfigError, match=match) as e:
        build(base(), override)
    assert "\n" not in str(e.value)


def test_lora_trains_task_rl_only():
    with pytest.raises(ConfigError, match=r"lora.rank=4: LoRA trains task RL \(job='rl'\) only"):
        build(rwml(), "lora.rank=4")
    assert build(rwml()).lora.rank == 0
