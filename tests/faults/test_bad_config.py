"""Bad configs are one line before anything is built: non-finite floats (NaN passes every
comparison), a preset the build would not know, an empty out_dir, a config file that raises or
does not parse; and through the launcher, exit code 2 and one line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jaxscaffold import config as config_lib
from jaxscaffold.config import ConfigError
from jaxscaffold.train import config_checks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "configs")


def build(*overrides, name="tiny.py"):
    cd = config_lib.load_file(os.path.join(CONFIGS, name))
    return config_checks.checked(config_lib.parse_overrides(cd, list(overrides)))


@pytest.mark.parametrize("override", ["rl.lr=nan", "rl.lr=inf", "rl.grad_clip=nan", "rollout.temperature=nan",
                                      "envs.step_timeout_s=nan", "rollout.top_p=-inf", "memory.hbm_gb=nan",
                                      "envs.tau2_user.timeout_s=inf", "lora.alpha=nan"])
def test_non_finite_floats_are_refused(override):
    field = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"config\.{field}=(nan|inf|-inf) must be a finite number") as e:
        build(override)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("config", ["tiny.py", "rwml_tiny.py"])
def test_every_float_field_is_checked(config):
    """Each float field of the typed config, set to NaN, is refused (the check walks them all)."""
    cfg = build(name=config)
    floats = [k for k, v in config_lib.flat_fields(cfg.to_dict()).items() if isinstance(v, float)]
    assert len(floats) > (15 if config == "tiny.py" else 25)
    for name in floats:
        with pytest.raises(ConfigError, match="finite"):
            config_lib.replace(cfg, **{name: float("nan")})


def test_range_refuses_nan_directly():
    with pytest.raises(ConfigError):
        config_lib.check_range("x", float("nan"), 0.0)


@pytest.mark.parametrize("override,message", [
    ("model.preset=TINY", r"config\.model\.preset='TINY': write 'tiny'"),
    ("out_dir=", r"config\.out_dir is empty"),
    ("rl.max_bad_steps=0", r"config\.rl\.max_bad_steps=0 must be >= 1"),
    ("rl.max_empty_steps=0", r"config\.rl\.max_empty_steps=0 must be >= 1"),
])
def test_one_line_config_errors(override, message):
    with pytest.raises(ConfigError, match=message) as e:
        build(override)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("body,message", [
    ("def get_config(:\n", r"bad\.py:1: syntax error"),
    ("raise RuntimeError('boom')\n", r"bad\.py raised RuntimeError: boom"),
    ("def get_config():\n    return 1 / 0\n", r"bad\.py raised ZeroDivisionError"),
])
def test_a_config_file_that_raises_or_does_not_parse(tmp_path, body, message):
    path = tmp_path / "bad.py"
    path.write_text(body)
    with pytest.raises(ConfigError, match=message) as e:
        config_lib.load_file(str(path))
    assert "\n" not in str(e.value)


def test_launcher_nan_config_is_one_line_exit_2(tmp_path):
    """The launcher: `--config.rl.lr=nan` exits 2 with one line on stderr, before JAX or a model."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "tpu_train.py"), "--config", "tiny.py",
                           "--config.rl.lr=nan", f"--config.out_dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == ["error: config.rl.lr=nan must be a finite number"]
    assert not (tmp_path / "run").exists()  # nothing written
