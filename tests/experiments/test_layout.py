"""experiments/ sits on top of the package: nothing in jaxscaffold/, configs/ or launch/ imports
it, no experiment trains in a loop of its own (they train through the package's trainer), and
the study runner finds each experiment's study by its folder's name."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def imported_modules(path: str) -> set[str]:
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_nothing_a_run_imports_reaches_into_experiments():
    offenders = []
    for top in ("jaxscaffold", "configs", "launch"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    if any(m == "experiments" or m.startswith("experiments.") for m in imported_modules(path)):
                        offenders.append(os.path.relpath(path, ROOT))
    assert offenders == []


def test_no_experiment_builds_a_train_step_of_its_own():
    steps = {"make_sft_step", "make_train_step", "init_train_state"}
    offenders = []
    for folder, _, files in os.walk(os.path.join(ROOT, "experiments")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                tree = ast.parse(open(path, encoding="utf-8").read(), path)
                used = {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for a in node.names}
                if used & steps:
                    offenders.append(os.path.relpath(path, ROOT))
    assert offenders == []


def test_every_experiment_study_loads_by_name():
    sys.path.insert(0, os.path.join(ROOT, "launch"))
    try:
        import study as study_launcher
    finally:
        sys.path.pop(0)
    from jaxscaffold.studies import runner
    for name in ("rooms_fee", "rooms_rwml"):
        path = study_launcher.study_path(name)
        assert path == os.path.join(ROOT, "experiments", name, "study.py")
        assert runner.load_study(path).arms
    out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "study.py"), "--study", "rooms_fe"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "no study 'rooms_fe'" in out.stderr and "rooms_fee, rooms_rwml" in out.stderr
