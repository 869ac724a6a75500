"""The README, as a user reads it: every file and link it names exists, it stays short, and its
runnable block (`<!-- run -->`) runs as written, each command in turn (training shortened to a
couple of steps), in an out_dir of its own so that it runs after the demo (`runs/tiny`) and in
any order. The run itself (`run_the_runnable_block`) happens in
`tests/train/test_trainer.py::test_embedded_default_smoke`, in the working directory where the
demo has just run: the suite trains the embedded default once."""

from __future__ import annotations

import json
import os
import re
import shlex

from tests.in_process import run_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
QUICK = ["--config.steps=2", "--config.eval.every=2", "--config.eval.tasks=2", "--config.rollout.tasks_per_step=2",
         "--config.rollout.group_size=2", "--config.rollout.max_new_tokens=8"]


def runnable_commands() -> list[str]:
    blocks = re.findall(r"<!-- run -->\n```bash\n(.*?)```", README, re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_the_readme_is_short_and_names_what_exists():
    assert len(README.splitlines()) <= 250
    for path in set(re.findall(r"\]\(([^)#]+)\)", README)):  # markdown links
        assert os.path.exists(os.path.join(ROOT, path)), path
    for script in set(re.findall(r"(?:python|bash) ((?:launch|experiments)/[\w/]+\.(?:py|sh))", README)):
        assert os.path.isfile(os.path.join(ROOT, script)), script
    for config in set(re.findall(r"--config ([\w]+\.py)", README)):
        assert os.path.isfile(os.path.join(ROOT, "configs", config)), config
    assert not re.search(r"20\d\d-\d\d-\d\d|shared/|REFERENCE\.md", README)


def test_the_runnable_block_trains_in_its_own_out_dir():
    commands = runnable_commands()
    assert commands and all(c.startswith("python launch/") for c in commands)
    out_dirs = [re.search(r"--config\.out_dir=(\S+)", c) for c in commands if "tpu_train.py" in c]
    assert out_dirs and all(m and m.group(1) != "runs/tiny" for m in out_dirs)  # not the demo's


def run_the_runnable_block(workdir) -> None:
    """Runs the README's runnable block as written in `workdir`, a checkout's root (its
    `launch/` and `configs/` linked there), where the demo may have run: each command must
    succeed and write what the block says. Each script runs in this process (`run_script`),
    saving a process start and its imports each: other tests run every one of these scripts as
    a command (tests/train/test_startup.py, tests/envs/test_eval_gold.py,
    tests/train/test_trainer.py). Training uses one device, as the command would in a process
    of its own (the tests' 8 devices are this process's)."""
    for name in ("launch", "configs"):
        os.symlink(os.path.join(ROOT, name), os.path.join(workdir, name))
    for command in runnable_commands():
        script, *args = shlex.split(command)[1:]
        args += QUICK + ["--config.mesh.devices=1"] if "tpu_train.py" in script else []
        code = run_script(script, args, cwd=workdir).code
        assert code == 0, f"{command}: exit {code}"
    run = os.path.join(workdir, "runs", "readme_tiny")
    assert json.load(open(os.path.join(run, "results.json")))["step"] == 2
    assert os.path.exists(os.path.join(run, "curves.png"))
    assert os.path.exists(os.path.join(workdir, "runs", "readme_tiny_hf", "config.json"))
