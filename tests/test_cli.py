"""The console commands (`jaxscaffold-train` ...) run the checkout's launchers as
`python launch/<script>` does: same output, same exit code; without a checkout, one line."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

import pytest

from jaxscaffold import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_command_is_declared_and_names_a_launcher():
    scripts = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]["scripts"]
    targets = {name: target.split(":") for name, target in scripts.items()}
    assert {module for module, _ in targets.values()} == {"jaxscaffold.cli"}
    assert {name.removeprefix("jaxscaffold-") for name in scripts} == set(cli.SCRIPTS)
    for name, (_, function) in targets.items():
        assert callable(getattr(cli, function)), name
    for script in cli.SCRIPTS.values():
        assert os.path.isfile(os.path.join(ROOT, "launch", script)), script


@pytest.mark.parametrize("argv", [["--config", "tiny.py", "--config.rl.lrr=1"], ["--config", "nonexistent.py"]])
def test_train_answers_as_the_launcher_does(argv):
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    by_command = subprocess.run([sys.executable, "-c", "from jaxscaffold import cli; cli.train()", *argv],
                                capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    by_script = subprocess.run([sys.executable, "launch/tpu_train.py", *argv], capture_output=True, text=True,
                               env=env, cwd=ROOT, timeout=120)
    assert by_command.returncode == by_script.returncode == 2
    assert by_command.stderr == by_script.stderr and len(by_command.stderr.strip().splitlines()) == 1


def test_without_a_checkout_it_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "CHECKOUT", str(tmp_path))
    with pytest.raises(SystemExit) as exit_:
        cli.plan()
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: jaxscaffold-plan runs launch/plan.py") and "\n" not in err
