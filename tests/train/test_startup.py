"""What a run says as it starts: a quiet console (no third-party INFO), the start-up summary,
the recorded config, the logged learning rate, and a refused resume in one line."""

import json
import logging
import os
import re
import subprocess
import sys

import jax
import pytest

from jaxscaffold.models import config as model_config_lib
from jaxscaffold.models import qwen3
from jaxscaffold.train.startup import configure_logging

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = ["--config.steps=2", "--config.rollout.tasks_per_step=2", "--config.rollout.group_size=4",
         "--config.rollout.max_new_tokens=8", "--config.envs.num_workers=0", "--config.mesh.devices=1",
         "--config.envs.eval=letters", "--config.eval.tasks=4", "--config.eval.max_len=0", "--config.eval.every=2",
         "--config.checkpoint.every=1", "--config.rl.warmup_steps=2",
         "--config.eval.at_start=false"]  # the ETA test below wants an evaluation not yet timed


def _launch(out_dir, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "launch", "tpu_train.py"), "--config", "tiny.py",
                           f"--config.out_dir={out_dir}", *SMALL, *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": ROOT})


@pytest.mark.slow
def test_a_quick_run_is_quiet_summarises_itself_and_refuses_a_changed_resume(tmp_path, monkeypatch, capsys):
    out = _launch(tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    noise = [line for line in text.splitlines() if re.search(r"\bINFO\b|absl|orbax", line)]
    assert not noise, noise[:5]
    # The summary: model, its parameter count (an independent count of the tiny preset's
    # parameter tree), devices and mesh, envs with task counts, out_dir.
    tiny = model_config_lib.tiny(param_dtype="float32", compute_dtype="float32")
    n = sum(x.size for x in jax.tree.leaves(jax.eval_shape(lambda: qwen3.init_params(tiny, jax.random.key(0)))))
    assert f"model    preset tiny: {n:,} parameters" in text
    assert re.search(r"devices  1 x \S+ \(cpu\) on 1 process\(es\); mesh data=1 fsdp=1 tensor=1", text)
    assert re.search(r"train    letters \d+ \(train\)", text) and "eval     letters 4 (test) every 2 steps" in text
    assert f"run      {tmp_path} (fresh; 2 steps" in text
    assert re.search(r"step 1/2 .* eta after step 2\n", text)  # step 1 compiles: no ETA from it
    assert json.loads((tmp_path / "config.json").read_text())["rl"]["warmup_steps"] == 2
    # The learning rate of each step's update: linear warmup from 0 over 2 updates (one a step).
    lrs = [json.loads(line)["train/lr"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lrs == pytest.approx([0.0, 0.03 / 2])
    # The refused resume: tpu_train.py's main in this process, saving a process start (the run
    # above is the command's; it refuses before building a model)
    monkeypatch.syspath_prepend(os.path.join(ROOT, "launch"))
    import tpu_train
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        tpu_train.main(["--config", "tiny.py", f"--config.out_dir={tmp_path}", *SMALL, "--config.steps=3",
                        "--config.rl.lr=0.01"])
    err = capsys.readouterr().err
    assert refused.value.code == 2
    assert err.strip().splitlines() == [err.strip()]
    assert "changes rl.lr 0.03 -> 0.01" in err and "allow_change=rl.lr" in err


def test_verbose_lets_third_party_info_through():
    absl, root = logging.getLogger("absl"), logging.getLogger()
    levels = absl.level, root.level
    try:
        configure_logging(False)
        assert not absl.isEnabledFor(logging.INFO) and absl.isEnabledFor(logging.WARNING)
        assert logging.getLogger("jaxscaffold.train.trainer").isEnabledFor(logging.INFO)
        configure_logging(True)
        assert absl.isEnabledFor(logging.INFO) and logging.getLogger("orbax").isEnabledFor(logging.INFO)
    finally:
        absl.setLevel(levels[0])
        root.setLevel(levels[1])
