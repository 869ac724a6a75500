"""The Colab notebook, run as written by a kernel-less runner on this machine's CPU: every code
cell in order (IPython's `!shell` and `%cd` lines translated, `{name}` expanded as IPython
does), with a local tiny checkpoint for MODEL, a short run in EXTRA and outputs under a temp
dir; the Colab-only lines (Drive, apt-get, pip) are behind the notebook's own IN_COLAB guard.
Then every cell again (but the plan, which only compiles and prints): the notebook is
idempotent and its training cell resumes."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import types

import jax
import pytest

from jaxscaffold.models import config as model_config, hf_io, qwen3
from jaxscaffold.models.tokenizer import write_hf_tokenizer
from tests.in_process import run_script
from tests.train.configs import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "launch", "colab_tpu.ipynb")
SHORT = ("--config.steps=2 --config.feedback.switch_step=1 --config.eval.every=2 --config.eval.at_start=false "
         "--config.rollout.tasks_per_step=1 --config.rollout.group_size=2 --config.rollout.max_new_tokens=8 "
         "--config.rollout.max_turns=6 --config.eval.max_turns=2 --config.feedback.probability=1.0 --config.envs.eval=sciworld::1 "
         "--config.eval.batch_size=1 --config.model.compute_dtype=float32 --config.model.cache_dtype=float32 "
         "--config.envs.num_workers=1 --config.checkpoint.every=1 --config.rl.micro_batches=1 "
         "--config.mesh.devices=1")  # one device, as a process of its own has here (the tests' 8 are this process's)
# The cells' commands the runner runs in this process (each saves a process start and its
# imports; tests/train/test_startup.py and test_trainer.py run both as commands); plan.py sets
# up its own fake devices before importing jax, so it runs as a command.
IN_PROCESS = ("launch/tpu_train.py", "launch/export_hf.py")


def code_cells() -> list[str]:
    return ["".join(c["source"]) for c in json.load(open(NOTEBOOK))["cells"] if c["cell_type"] == "code"]


def to_python(source: str) -> str:
    """A cell with IPython's escapes as calls: `!cmd` -> _shell("cmd"), `%cd d` -> _cd("d")."""
    lines = []
    for line in source.splitlines():
        body = line.lstrip()
        indent = line[: len(line) - len(body)]
        if body.startswith("!"):
            lines.append(f"{indent}_shell({body[1:]!r})")
        elif body.startswith("%cd "):
            lines.append(f"{indent}_cd({body[4:]!r})")
        else:
            lines.append(line)
    return "\n".join(lines)


class Runner:
    """Runs cells in one namespace, as a kernel would; shell commands must succeed."""

    def __init__(self, env: dict, shown: list, monkeypatch):
        self.ns: dict = {"_shell": self.shell, "_cd": self.cd, "__name__": "__main__"}
        self.env, self.outputs = env, []
        display = types.ModuleType("IPython.display")  # Colab's display: record what is shown
        display.Image = lambda path: shown.append(path) or path
        display.display = lambda *objs: None
        # Restored after the test: a stub IPython left in sys.modules breaks matplotlib later on
        # in the same worker (it reads IPython.version_info when the module is present).
        if "IPython" not in sys.modules:
            monkeypatch.setitem(sys.modules, "IPython", types.ModuleType("IPython"))
        monkeypatch.setitem(sys.modules, "IPython.display", display)

    def expand(self, text: str) -> str:
        return re.sub(r"\{(\w+)\}", lambda m: str(self.ns[m.group(1)]), text)

    def shell(self, command: str) -> None:
        command = self.expand(command)
        argv = shlex.split(command)
        if argv[0] == "python" and argv[1] in IN_PROCESS:
            return self.in_process(command, argv[1:])
        out = subprocess.run(command, shell=True, cwd=os.getcwd(), env=self.env,
                             capture_output=True, text=True, timeout=1200)
        self.outputs.append(out.stdout)
        assert out.returncode == 0, f"{command}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"

    def in_process(self, command: str, argv: list[str]) -> None:
        """`python SCRIPT ARGS` in the current directory, in this process (`run_script`), saving
        a process start and its imports; a failed exit fails the test."""
        with pytest.MonkeyPatch.context() as patch:
            for name in ("IPython", "IPython.display"):  # the cells' stub: matplotlib reads IPython when present
                patch.delitem(sys.modules, name, raising=False)
            code, out, err = run_script(argv[0], argv[1:], capture=True)
        assert code == 0, f"{command}: exit {code}\n{out[-2000:]}\n{err[-3000:]}"
        self.outputs.append(out)

    def cd(self, path: str) -> None:
        os.chdir(self.expand(path))

    def run(self, source: str, overrides: dict | None = None) -> None:
        exec(compile(to_python(source), "<cell>", "exec"), self.ns)
        self.ns.update(overrides or {})


@pytest.mark.slow
def test_the_notebook_runs_as_written_and_again(tmp_path, monkeypatch):
    pytest.importorskip("scienceworld")
    ckpt = tmp_path / "ckpt"
    config = model_config.tiny()
    hf_io.save_pretrained(str(ckpt), config, qwen3.init_params(config, jax.random.key(0)))
    write_hf_tokenizer(ckpt)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=os.environ.get("JAXSCAFFOLD_TEST_XLA_FLAGS", ""),
               JAXSCAFFOLD_OUTPUTS=str(tmp_path / "out"),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))  # `python`: this one
    monkeypatch.setenv("JAXSCAFFOLD_OUTPUTS", str(tmp_path / "out"))
    monkeypatch.chdir(tmp_path)
    shown: list = []
    runner = Runner(env, shown, monkeypatch)
    settings = {"MODEL": str(ckpt), "EXTRA": SHORT, "REPO_DIR": ROOT, "MORE_STEPS": 3}
    cells = code_cells()
    for i, cell in enumerate(cells):
        runner.run(cell, settings if i == 0 else None)
    run_dir = tmp_path / "out" / "runs" / "colab"
    assert runner.ns["RUN_DIR"] == str(run_dir) and shown == [f"{run_dir}/curves.png"]
    assert any("fits" in o for o in runner.outputs)  # the plan cell's verdict
    results = json.load(open(run_dir / "results.json"))
    assert results["step"] == 3 and results["total_steps"] == 3  # the resume cell went on to MORE_STEPS
    assert (tmp_path / "out" / "hf" / "colab" / "config.json").exists()
    assert (tmp_path / "out" / "hf" / "colab_peft" / "adapter_config.json").exists()
    history = {h["step"]: h for h in map(json.loads, open(run_dir / "metrics.jsonl"))}
    # both phases ran: AG on early episode steps at step 1 (<= switch_step), OE on late ones after
    assert history[1]["rollout/feedback_ag"] > 0 and history[1]["rollout/feedback_oe"] == 0
    assert history[2]["rollout/feedback_oe"] > 0 and history[2]["rollout/feedback_ag"] == 0
    for i, cell in enumerate(cells):  # again: nothing is redone, the training cell resumes at its end
        if "launch/plan.py" not in cell:  # (the plan cell only compiles and prints: done above)
            runner.run(cell, settings if i == 0 else None)
    assert json.load(open(run_dir / "results.json"))["step"] == 3


def test_the_colab_config_fits_one_16gb_chip():
    """configs/colab.py's memory plan for one 16 GB chip, through launch/plan.py as the notebook
    runs it (compiled on a fake device). A fresh process: this compile of Qwen3-0.6B shapes
    segfaulted twice inside XLA's compile in a long-lived pytest-xdist worker (clean-clone CI,
    -n 2), never in a process of its own; the cause is not found."""
    from jaxscaffold import config as config_lib
    cfg = config_lib.from_configdict(load_config("colab"))
    assert cfg.lora.rank > 0 and cfg.envs.train == "sciworld" and 0 < cfg.feedback.switch_step < cfg.steps
    assert cfg.rollout.max_turns > 5  # OE's late episode steps (6-10) are reached
    env = {**os.environ, "XLA_FLAGS": os.environ["JAXSCAFFOLD_TEST_XLA_FLAGS"]}  # (plan.py adds its devices)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "plan.py"), "--config", "colab.py",
                          "--devices", "1", "--hbm-gb", "16", "--json"],
                         capture_output=True, text=True, env=env, timeout=600)
    verdict = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0 and verdict["fits"], (verdict, out.stderr[-2000:])
    assert verdict["peak"] < 16e9 and verdict["devices"] == 1


def test_the_install_cell_installs_only_what_the_config_needs(tmp_path, monkeypatch):
    """The install cell's command list, run as written through launch/install_packages.sh with a
    pip that records its arguments: for colab.py, Java and the package on the TPU build of jax
    with ScienceWorld at pyproject's pin, no other benchmark package; for another config every
    benchmark package, as launch/dev.sh installs them."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))
    [sciworld_pin] = [p.split()[0] for p in pyproject["project"]["optional-dependencies"]["envs"]
                      if p.startswith("scienceworld")]
    fake_pip = tmp_path / "pip"
    fake_pip.write_text('#!/bin/sh\necho "$@" >> "$PIP_LOG"\n')
    fake_pip.chmod(0o755)
    cell = next(c for c in code_cells() if c.startswith("# Install"))
    monkeypatch.chdir(tmp_path)
    for config in ("colab.py", "fee.py"):
        runner = Runner(dict(os.environ), [], monkeypatch)
        runner.ns.update(os=os, IN_COLAB=False, REPO_DIR=ROOT, REPO_URL="", BRANCH="main", CONFIG=config)  # (os: cell 2)
        runner.run(cell)
        java, install = runner.ns["INSTALL"]
        assert "openjdk-17" in java and install.startswith("bash launch/install_packages.sh pip ")
        log = tmp_path / f"{config}.log"
        out = subprocess.run(install.replace(" pip ", f" {fake_pip} ", 1), shell=True, cwd=ROOT, capture_output=True,
                             text=True, env={**os.environ, "PIP_LOG": str(log)}, timeout=60)
        assert out.returncode == 0, out.stderr
        calls = log.read_text().splitlines()
        if config == "colab.py":
            assert calls == [f"install -q -e .[tpu] {sciworld_pin}"]
        else:
            assert calls[0] == "install -q -e .[tpu,envs]"
            assert any("bfcl-eval" in c for c in calls) and any("alfworld" in c for c in calls)
    bad = subprocess.run(["bash", os.path.join(ROOT, "launch", "install_packages.sh"), str(fake_pip), "tpu", "bfcl"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "all or sciworld" in bad.stderr
