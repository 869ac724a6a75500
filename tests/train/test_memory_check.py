"""The start-up memory check: a run that cannot fit is refused in one line before its model
loads; the check's verdict is launch/plan.py's for the same config and memory."""

import json
import os
import subprocess
import sys

import jax
import pytest

from jaxscaffold import config as config_lib
from jaxscaffold.train import memory_check

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--config.mesh.devices=1", "--config.envs.num_workers=0", "--config.envs.eval=letters",
        "--config.eval.tasks=2", "--config.steps=1", "--config.eval.at_start=false"]


def tiny(*overrides):
    cd = config_lib.load_file(os.path.join(ROOT, "configs", "tiny.py"))
    return config_lib.from_configdict(config_lib.parse_overrides(cd, [o.removeprefix("--config.") for o in overrides]))


def test_cpu_reports_no_limit_so_the_check_needs_hbm_gb():
    assert memory_check.device_memory_bytes(jax.devices()[0]) is None
    assert memory_check.check_fits(tiny(*TINY)) is None
    with pytest.raises(config_lib.ConfigError, match="memory.hbm_gb"):
        tiny("memory.hbm_gb=-1")


def test_the_verdict_is_launch_plans(tmp_path):
    cfg = tiny(*TINY, "memory.hbm_gb=2")
    result = memory_check.check_fits(cfg, jax.devices()[:1])
    out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "plan.py"), "--config", "tiny.py", *TINY,
                          "--devices", "1", "--hbm-gb", "2", "--json"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "XLA_FLAGS": os.environ["JAXSCAFFOLD_TEST_XLA_FLAGS"]})  # + plan's devices
    printed = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0 and printed["fits"] and result.fits()
    for key in ("params", "opt_state", "kv_cache", "sampler_weights"):  # exact byte counts
        assert printed[key] == getattr(result, key), key
    with pytest.raises(memory_check.PlanDoesNotFit, match="does not fit 1 device"):
        memory_check.check_fits(tiny(*TINY, f"memory.hbm_gb={result.peak / 2e9}"), jax.devices()[:1])


def test_the_launcher_refuses_a_run_that_cannot_fit_in_one_line(tmp_path, monkeypatch, capsys):
    """(tpu_train.py's main in this process, where the check's programs compiled above are
    cached; tests/test_config.py and tests/train/test_startup.py run it as a command.)"""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "launch"))
    import tpu_train
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        tpu_train.main(["--config", "tiny.py", *TINY, f"--config.out_dir={tmp_path}", "--config.memory.hbm_gb=0.01"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1, err[-3000:]
    assert lines[0].startswith("error: the run does not fit 1 device(s) of 0.0 GB: the train phase needs")
    assert not os.path.exists(tmp_path / "checkpoints")  # refused before the model was built
