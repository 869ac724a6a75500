"""docs/environments.md's "Adding an environment", run as written: its files in a fresh directory, its
commands through the launcher (shortened to a couple of steps), the own env as one file plus one
registration that the registry, the pool and feedback read, and the JSONL env against rewards
computed by hand."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys

import pytest

from jaxscaffold.envs import jsonl, prompts, registry
from jaxscaffold.envs.base import EnvError
from jaxscaffold.envs.pool import EnvPool
from jaxscaffold.feedback import enrichers, units
from tests.in_process import run_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICK = ["--config.steps=2", "--config.eval.every=2", "--config.eval.tasks=2", "--config.eval.max_len=0",
         "--config.rollout.tasks_per_step=2", "--config.rollout.group_size=2",
         "--config.rollout.max_new_tokens=8"]


def readme_section():
    text = open(os.path.join(ROOT, "docs", "environments.md"), encoding="utf-8").read()
    return text.split("## Adding an environment", 1)[1].split("\n## ", 1)[0]


def files_and_commands(section: str):
    files = dict(re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", section, re.S))
    commands = [c.replace("\\\n", " ") for c in re.findall(r"<!-- run -->\n```bash\n(.*?)```", section, re.S)]
    return files, commands


@pytest.fixture
def workdir(tmp_path):
    files, _ = files_and_commands(readme_section())
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    for name in ("launch", "configs"):  # the checkout's root, where the page's commands run
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    return tmp_path


@pytest.fixture
def registries_restored():
    """The env, prompt and feedback registries, and the modules the page's files make, as they
    were before the test (a config registers its env in the process that loads it)."""
    saved = {id(t): dict(t) for t in (registry.ENVS, prompts.SYSTEM_PROMPTS, enrichers.FEEDBACK)}
    modules = set(sys.modules)
    yield
    for t in (registry.ENVS, prompts.SYSTEM_PROMPTS, enrichers.FEEDBACK):
        t.clear()
        t.update(saved[id(t)])
    for name in set(sys.modules) - modules:
        if name in ("countdown", "countdown_config", "myrewards", "tiny", "base", "tpu_train"):
            sys.modules.pop(name)


def run_command(command: str, cwd, extra: list[str]) -> None:
    """Runs a page's `PYTHONPATH=. python launch/SCRIPT ARGS` in `cwd`, in this process
    (`run_script`), saving a process start and its imports (tests/train/test_startup.py runs
    tpu_train.py as a command); a failed exit fails the test."""
    env_prefix, _, rest = command.partition(" python ")
    assert env_prefix == "PYTHONPATH=.", command
    script, *args = shlex.split(rest)
    code = run_script(script, [*args, *extra], cwd=cwd, sys_path=[cwd]).code
    assert code == 0, f"{command}: exit {code}"


def test_the_readme_section_has_its_files_and_commands():
    files, commands = files_and_commands(readme_section())
    assert set(files) == {"my_tasks.jsonl", "myrewards.py", "countdown.py", "countdown_config.py"}
    assert len(commands) == 2 and all("launch/tpu_train.py" in c for c in commands)
    # each example trains in an out_dir of its own, so it runs after the demo (runs/tiny)
    assert "--config.out_dir=runs/my_tasks" in commands[0] and 'c.out_dir = "runs/countdown"' in files["countdown_config.py"]


def test_the_own_env_is_one_file_and_one_registration(workdir, monkeypatch):
    """The env's file declares its EnvSpec; the config's one `register` makes the registry, the
    pool (which builds envs from the spec's import path) and feedback know it."""
    files, _ = files_and_commands(readme_section())
    assert "EnvSpec(" in files["countdown.py"] and "feedback" not in files["countdown.py"]  # envs know no feedback
    assert files["countdown_config.py"].count("registry.register(") == 1
    monkeypatch.syspath_prepend(str(workdir))
    monkeypatch.chdir(workdir)
    saved = {id(t): dict(t) for t in (registry.ENVS, prompts.SYSTEM_PROMPTS, enrichers.FEEDBACK)}
    try:
        import importlib.util
        spec = importlib.util.spec_from_file_location("countdown_config", workdir / "countdown_config.py")
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        assert registry.spec("countdown").import_path == "countdown:CountdownEnv"
        assert prompts.system_prompt("countdown") == "You are a player. Answer with one word."
        registry.check_split("countdown", "test")
        with pytest.raises(ValueError, match="countdown has no split 'dev'; splits: train, test"):
            registry.check_split("countdown", "dev")
        tasks = registry.catalogue("countdown", "train")
        assert [t.spec["start"] for t in tasks] == [3, 4, 5, 6, 7, 8]
        assert units.unit("countdown", "ag") == "action"
        enrich = enrichers.enricher("countdown")
        with EnvPool(1) as pool:  # a spawned worker: it imports the env by the spec's path
            first = pool.reset(tasks[:1])[0]
            assert enrich("ag", first, 0, []) == first.text + "\nHint: say down"
            out = pool.step({0: "down"})[0]
        assert out.observation.text == "The counter is 2." and not out.done
    finally:
        for t in (registry.ENVS, prompts.SYSTEM_PROMPTS, enrichers.FEEDBACK):
            t.clear()
            t.update(saved[id(t)])
        sys.modules.pop("countdown", None)


@pytest.mark.slow
@pytest.mark.parametrize("which", [0, 1], ids=["jsonl", "own_env_class"])
def test_the_readme_commands_train_and_evaluate(workdir, which, registries_restored):
    _, commands = files_and_commands(readme_section())
    run_command(commands[which], workdir, QUICK + ["--config.out_dir=run"])
    metrics = [json.loads(line) for line in open(workdir / "run" / "metrics.jsonl")]
    env = "jsonl" if which == 0 else "countdown"
    assert any(f"eval/success_{env}" in m or any(k.startswith(f"eval/{env}") for k in m) for m in metrics), metrics[-1]
    assert any("rollout/reward" in m for m in metrics)


def test_jsonl_tasks_and_rewards(workdir):
    tasks = registry.catalogue("jsonl", str(workdir / "my_tasks.jsonl"))
    assert [t.task_id for t in tasks] == ["add-1", "add-2"] and tasks[1].category == "small"
    sys.path.insert(0, str(workdir))
    try:
        env = jsonl.JsonlEnv(reward="myrewards:first_number_or_words", max_attempts=2)
        obs = env.reset(tasks[0])
        assert obs.text.startswith("What is 17 + 25?") and obs.system_prompt
        first = env.step("<think>17 + 25 is 42</think>It is 41")  # the reasoning is not the answer
        assert (first.done, first.reward, first.observation.text) == (False, 0.0, jsonl.RETRY)
        second = env.step("42")
        assert second.done and second.reward == 1.0 and second.info == {"won": True, "score": 1.0, "attempts": 2}
        env.reset(tasks[1])
        last = env.step("thirteen")  # neither the number nor a number: 0, and one attempt left
        assert not last.done and env.step("7").reward == 0.2  # the best attempt's reward
    finally:
        sys.path.remove(str(workdir))


def test_builtin_rewards_and_bad_input(tmp_path):
    assert jsonl.exact_match("  The Answer. ", {"answer": "the answer"}) == 1.0
    assert jsonl.exact_match("b", {"answer": ["a", "b"]}) == 1.0 and jsonl.exact_match("c", {"answer": "a"}) == 0.0
    assert jsonl.last_number("so 3, then 1,250.0", {"answer": "1250"}) == 1.0
    assert jsonl.last_number("no number", {"answer": "3"}) == 0.0
    bad = tmp_path / "bad.jsonl"
    for text, message in (('{"prompt": "a"}\nnot json\n', "bad.jsonl:2: not JSON"),
                          ('{"question": "a"}\n', "needs a non-empty string \"prompt\""),
                          ('{"id": 1, "prompt": "a"}\n{"id": 1, "prompt": "b"}\n', "appears more than once")):
        bad.write_text(text)
        with pytest.raises(ValueError, match=re.escape(message)):
            jsonl.catalogue(str(bad))
    with pytest.raises(ValueError, match="not found"):
        jsonl.catalogue(str(tmp_path / "none.jsonl"))
    with pytest.raises(ValueError, match="cannot be imported"):
        jsonl.JsonlEnv(reward="nosuchmodule:f")
    env = jsonl.JsonlEnv(reward="tests.envs.test_adding_an_environment:returns_text")
    bad.write_text('{"prompt": "a"}\n')
    env.reset(jsonl.catalogue(str(bad))[0])
    with pytest.raises(EnvError, match="expected a finite number"):
        env.step("x")


def returns_text(answer, item):
    return "1.0"
