"""Data the package needs at run time ships inside it; ALFWorld's game files are found or explained."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from jaxscaffold.envs import alfworld, alfworld_data

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "jaxscaffold"


def test_sciworld_splits_ship_with_the_package_and_load_without_shared(tmp_path):
    data = PACKAGE / "envs" / "data" / "sciworld"
    for level in ("L0", "L1", "L2"):
        splits = json.loads((data / f"{level}_idx.json").read_text())
        assert set(splits) == {"train", "test"} and all(len(v) > 0 for v in splits.values())
    assert "Source:" in (data / "SOURCE.md").read_text()
    # A user's clone: no shared/ anywhere, no override; the catalogue loads from the package.
    env = {k: v for k, v in os.environ.items() if k != "JAXSCAFFOLD_DATA"}
    code = "from jaxscaffold.envs import sciworld; print(len(sciworld.catalogue('test')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == len(json.loads((data / "L0_idx.json").read_text())["test"])


def test_no_code_names_an_absolute_machine_path():
    root = PACKAGE.parent
    for folder in ("jaxscaffold", "launch", "configs", "tests"):
        for path in (root / folder).rglob("*.py"):
            if path == pathlib.Path(__file__).resolve():
                continue
            text = path.read_text()
            for bad in ("/work/", "/root/", "/home/"):
                assert bad not in text, f"{path} names {bad}"


def test_alfworld_data_errors_say_how_to_get_the_files(tmp_path, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    monkeypatch.setattr(alfworld_data, "DEFAULT_DATA_DIR", str(tmp_path / "nothing"))
    with pytest.raises(FileNotFoundError, match=r"ALFWorld's default location.*alfworld_data unpack ARCHIVE.*\$ALFWORLD_DATA"):
        alfworld.resolve_data_dir()
    (tmp_path / "cache" / "json_2.1.1" / "valid_seen").mkdir(parents=True)
    monkeypatch.setattr(alfworld_data, "DEFAULT_DATA_DIR", str(tmp_path / "cache"))
    assert alfworld.resolve_data_dir() == tmp_path / "cache" / "json_2.1.1"
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "elsewhere"))
    with pytest.raises(FileNotFoundError, match=r"\$ALFWORLD_DATA"):
        alfworld.resolve_data_dir()
