"""pyproject.toml builds without a warning of setuptools': the wheel and the editable install
(PEP 660, as `pip install -e .` builds it) with the console commands, run through setuptools' own build backend in a copy
of the project's packaging files, with every warning an error."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = """
import sys, warnings
warnings.simplefilter("error")
from setuptools import build_meta
name = getattr(build_meta, sys.argv[1])("dist")
print(name)
"""


@pytest.mark.parametrize("hook", ["build_wheel", "build_editable"])
def test_the_package_builds_without_warnings(tmp_path, hook):
    pytest.importorskip("setuptools", minversion="77")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(os.path.join(ROOT, name), tmp_path / name)
    shutil.copytree(os.path.join(ROOT, "jaxscaffold"), tmp_path / "jaxscaffold",
                    ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run([sys.executable, "-c", BUILD, hook], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    wheel = tmp_path / "dist" / out.stdout.strip().splitlines()[-1]
    names = zipfile.ZipFile(wheel).namelist()
    [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "jaxscaffold-train = jaxscaffold.cli:train" in zipfile.ZipFile(wheel).read(entry_points).decode()
    if hook == "build_wheel":  # the package and its data, nothing from beside it
        assert "jaxscaffold/envs/data/sciworld/SOURCE.md" in names
        assert all(n.startswith(("jaxscaffold/", "jaxscaffold-")) for n in names)
    else:  # the editable wheel is one .pth line to the project folder
        [pth] = [n for n in names if n.endswith(".pth")]
        assert zipfile.ZipFile(wheel).read(pth).decode().strip() == str(tmp_path.resolve())
