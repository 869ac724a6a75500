"""Data never names code: a task file refers to reward functions only by the names of a
registry that code fills; nothing in the package imports or looks up by name a string that
comes from a data file or from model output."""

from __future__ import annotations

import ast
import os

import pytest

from jaxscaffold.envs import jsonl
from jaxscaffold.train.tasks import TaskSourceError, load_tasks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Every place that imports or runs code named by a string, and where that string comes from.
# A new one fails the test until it is reviewed and listed here.
REVIEWED = {
    ("jaxscaffold/config.py", "load_file"): "the config file the user names on the command line",
    ("jaxscaffold/studies/runner.py", "load_study"): "the study file the user names on the command line",
    ("jaxscaffold/envs/jsonl.py", "config_reward"): "envs.env_kwargs' reward (config), never a task line",
    ("jaxscaffold/envs/pool.py", "_resolve"): "env factories of the registry (code)",
    ("jaxscaffold/envs/registry.py", "_module"): "the registry's module names (code)",
    ("jaxscaffold/envs/sciworld.py", "resolve_callable"): "env_kwargs (config)",
    ("jaxscaffold/envs/tau2.py", "_resolve"): "env_kwargs / envs.tau2_user (config)",
    ("jaxscaffold/envs/bfcl.py", "_resolve"): "env_kwargs (config)",
    ("jaxscaffold/envs/bfcl.py", "make_instances"): "a data entry's class names, looked up in the fixed CLASS_MODULES",
    ("launch/bench.py", "main"): "a fixed table of suites (code)",
    ("launch/rooms_wm_base.py", "rooms_base_module"): "a fixed path in the checkout",
}
IMPORTERS = {"import_module", "__import__", "spec_from_file_location", "exec_module"}


def _calls(tree: ast.AST):
    """(enclosing function name, called name) of every call, innermost function first."""
    def walk(node, where):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else where
            if isinstance(child, ast.Call):
                f = child.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                yield inner, name, f
            yield from walk(child, inner)
    yield from walk(tree, "<module>")


def _sources():
    for top in ("jaxscaffold", "launch"):
        for base, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(base, name)
                    yield os.path.relpath(path, ROOT).replace(os.sep, "/"), open(path, encoding="utf-8").read()


def test_import_by_name_only_where_reviewed_and_no_eval_or_exec():
    found, builtins_run = set(), []
    for rel, text in _sources():
        for where, name, func in _calls(ast.parse(text, rel)):
            if name in IMPORTERS:
                found.add((rel, where))
            if isinstance(func, ast.Name) and func.id in ("eval", "exec", "compile"):
                builtins_run.append(f"{rel}:{where}")
    assert not builtins_run, f"eval / exec / compile of a string: {builtins_run}"
    unreviewed = sorted(found - set(REVIEWED))
    assert not unreviewed, f"import by name not reviewed (where does the string come from?): {unreviewed}"
    assert ("jaxscaffold/envs/jsonl.py", "config_reward") in found  # the scan sees the sites it lists


def test_a_task_line_cannot_name_code(tmp_path):
    """The issue's reproduction: a line naming builtins:eval made the env eval the model's answer."""
    marker = tmp_path / "pwned"
    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt": "x", "answer": "1", "reward": "builtins:eval"}\n')
    with pytest.raises(TaskSourceError, match=r"t\.jsonl:1: jsonl reward 'builtins:eval' is not registered") as e:
        load_tasks(f"jsonl:{path}", "train")
    assert "\n" not in str(e.value)
    # An env given such a task anyway (a catalogue built by hand) refuses it at reset, before any answer.
    env = jsonl.JsonlEnv()
    task = jsonl.Task("jsonl", "1", str(path), spec={"item": {"prompt": "x", "reward": "builtins:exec"}})
    with pytest.raises(ValueError, match="not registered"):
        env.reset(task)
    assert not marker.exists()


def test_registered_rewards_are_what_lines_name(tmp_path):
    calls = []
    jsonl.register_reward("starts_with_yes", lambda answer, item: calls.append(answer) or float(answer.startswith("yes")))
    try:
        path = tmp_path / "t.jsonl"
        path.write_text('{"prompt": "ok?", "reward": "starts_with_yes"}\n')
        [task] = jsonl.catalogue(str(path))
        env = jsonl.JsonlEnv()
        env.reset(task)
        assert env.step("yes indeed").reward == 1.0 and calls == ["yes indeed"]
        with pytest.raises(ValueError, match="without ':'"):
            jsonl.register_reward("mod:fn", len)
    finally:
        jsonl.REWARDS.pop("starts_with_yes")
