"""The Colab notebook's commands run as written on this machine's CPU (the same code path as
on the TPU runtime), with a local tiny checkpoint in place of the hub download and the run
shortened by extra overrides."""

import json
import os
import re
import subprocess
import sys

import jax
import pytest

from jaxscaffold.models import config as model_config, hf_io, qwen3
from jaxscaffold.models.tokenizer import write_hf_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "launch", "colab_tpu.ipynb")


def notebook_commands() -> list[str]:
    """The `!python launch/...` shell lines of the notebook, continuation lines joined."""
    cells = json.load(open(NOTEBOOK))["cells"]
    out = []
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        text = "".join(cell["source"]).replace("\\\n", " ")
        out += [line.strip()[1:] for line in text.splitlines() if line.strip().startswith("!python launch/")]
    return out


@pytest.mark.slow
def test_notebook_train_and_export_commands_run(tmp_path):
    pytest.importorskip("scienceworld")
    commands = notebook_commands()
    assert [c.split()[1] for c in commands] == ["launch/tpu_train.py", "launch/export_hf.py"]
    ckpt = tmp_path / "ckpt"
    config = model_config.tiny()
    hf_io.save_pretrained(str(ckpt), config, qwen3.init_params(config, jax.random.key(0)))
    write_hf_tokenizer(ckpt)
    short = ["--config.steps=1", "--config.eval.every=1", "--config.eval.tasks=1", "--config.eval.at_start=false",
             "--config.rollout.tasks_per_step=1", "--config.rollout.group_size=2",
             "--config.rollout.max_new_tokens=8", "--config.rollout.max_turns=2", "--config.eval.max_turns=2",
             "--config.model.compute_dtype=float32", "--config.envs.num_workers=1"]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"], env["XLA_FLAGS"] = "cpu", os.environ.get("JAXSCAFFOLD_TEST_XLA_FLAGS", "")
    for command in commands:
        command = command.replace("{ckpt}", str(ckpt)).replace("/content/", f"{tmp_path}/")
        args = command.split()
        if args[1] == "launch/tpu_train.py":
            args += short
        out = subprocess.run([sys.executable] + args[1:], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=900)
        assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "fee_run" / "curves.png").exists()
    assert (tmp_path / "fee_hf" / "config.json").exists()
    diff = re.search(r"max \|logit difference\| = (\S+)", out.stdout)
    assert diff and float(diff.group(1)) < 1e-4, out.stdout
