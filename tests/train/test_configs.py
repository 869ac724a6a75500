"""Every config file loads, names known things, and the launcher resolves names and overrides."""

import glob
import os
import subprocess
import sys

import pytest

from jaxscaffold.envs import registry
from jaxscaffold.feedback import schedule
from jaxscaffold.models import config as model_config
from jaxscaffold.rl import presets

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.py")))
# A file's named variants (`--config pilot.py:ag_early`) are configs too.
CONFIGS += [os.path.join(ROOT, "configs", f"pilot.py:{v}") for v in ("ag_early", "ag_late", "oe_early", "oe_late")]


def load(path):
    import importlib.util
    path, _, variant = path.partition(":")
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(variant) if variant else module.get_config()


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_config_is_consistent(path):
    c = load(path)
    assert c.rl.algorithm in presets.PRESETS
    if c.feedback.schedule == "bandit":  # learned: its arms are schedules
        for arm in c.feedback.bandit_arms.split(","):
            schedule.make(arm.strip())
    else:
        schedule.make(c.feedback.schedule)
    assert c.rollout.representation in ("trajectory", "stepwise")
    assert c.model.preset == "tiny" or c.model.preset in model_config.PRESETS
    from jaxscaffold.train.tasks import env_names
    for name in env_names(c.envs.train) + env_names(c.envs.eval):
        assert name in registry.ENVS, name


@pytest.mark.parametrize("name, prefix", [("base.py", "c."), ("rwml.py", "w.")])
def test_every_field_has_a_comment(name, prefix):
    """The files that declare fields (the others override them) comment every one."""
    text = open(os.path.join(ROOT, "configs", name)).read()
    for line in text.splitlines():
        if line.strip().startswith(prefix) and "=" in line and "ConfigDict()" not in line:
            assert "#" in line, f"uncommented config field in {name}: {line.strip()}"


def _launch(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "launch", "tpu_train.py"), *args],
                          capture_output=True, text=True, timeout=120)


def test_launcher_errors_are_clear():
    out = _launch("--config", "nonexistent.py")
    assert out.returncode != 0 and "no config 'nonexistent.py'" in out.stderr
    out = _launch("--config", "tiny.py", "--config.rl.no_such_field=1")
    assert out.returncode != 0 and "no_such_field" in out.stderr


def test_a_named_variant_of_a_config_file():
    """`--config pilot.py:ag_early` is pilot.py's get_config("ag_early") (ml_collections' config
    string); the file alone is its default; an unknown variant is one line, exit 2."""
    from jaxscaffold import config as config_lib
    variant = config_lib.load_file(config_lib.config_path("pilot.py:ag_early", os.path.join(ROOT, "configs")))
    default = config_lib.load_file(config_lib.config_path("pilot", os.path.join(ROOT, "configs")))
    assert (variant.feedback.schedule, variant.out_dir) == ("ag_early", "runs/pilot_ag_early")
    assert default.feedback.schedule == "ag_early_oe_late"
    out = _launch("--config", "pilot.py:ag_erly")
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0
    assert "no variant 'ag_erly'" in out.stderr and "did you mean ag_early" in out.stderr
    out = _launch("--config", "tiny.py:small")
    assert out.returncode == 2 and "no variant 'small'" in out.stderr
