"""`python -m jaxscaffold.envs.alfworld_data unpack ARCHIVE`: the one way to ALFWorld's game
files, checked on small archives laid out as the official ones (zip and tar.xz)."""

import io
import os
import subprocess
import sys
import tarfile
import zipfile

import pytest

from jaxscaffold.envs import alfworld as A
from jaxscaffold.envs import alfworld_data

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GAMES = {  # archive member -> contents
    "json_2.1.1/valid_seen/pick_and_place_simple-Apple-None-Fridge-1/trial_1/game.tw-pddl": b'{"a": 1}',
    "json_2.1.1/valid_unseen/look_at_obj_in_light-Book-None-DeskLamp-2/trial_7/game.tw-pddl": b'{"b": 2}',
    "json_2.1.1/train/pick_two_obj_and_place-Pen-None-Desk-3/trial_2/game.tw-pddl": b'{"c": 3}',
}
OTHERS = {  # not game files: never written
    "json_2.1.1/valid_seen/pick_and_place_simple-Apple-None-Fridge-1/trial_1/traj_data.json": b"{}",
    "json_2.1.1/README.md": b"hi",
    "../../valid_seen/x/y/escape.tw-pddl": b"no",
}


def _zip(path, members):
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _tar_xz(path, members):
    with tarfile.open(path, "w:xz") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("make", [_zip, _tar_xz])
def test_unpack_writes_only_the_game_files_where_the_adapter_reads_them(tmp_path, monkeypatch, make):
    archive = make(tmp_path / f"games.{make.__name__[1:]}", {**GAMES, **OTHERS})
    dest = tmp_path / "data"
    assert alfworld_data.unpack(archive, dest) == {"train": 1, "valid_seen": 1, "valid_unseen": 1}
    written = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert written == sorted(GAMES)
    for name, data in GAMES.items():
        assert (dest / name).read_bytes() == data
    monkeypatch.setenv("ALFWORLD_DATA", str(dest))
    [task] = A.catalogue("valid_seen")
    assert task.spec["task_type"] == "pick_and_place_simple" and task.task_id.endswith("trial_1")


def test_the_command_unpacks_into_alfworld_data_and_refuses_bad_archives_in_one_line(tmp_path):
    archive = _tar_xz(tmp_path / "games.tar.xz", GAMES)
    env = {"ALFWORLD_DATA": str(tmp_path / "data"), "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "jaxscaffold.envs.alfworld_data", "unpack"]
    out = subprocess.run([*cmd, str(archive)], env=env, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "unpacked 3 ALFWorld games" in out.stdout and "export" not in out.stdout  # already where it looks
    assert (tmp_path / "data" / next(iter(GAMES))).is_file()

    (tmp_path / "junk.zip").write_bytes(b"not an archive")
    _zip(tmp_path / "empty.zip", OTHERS)
    for bad, says in [("missing.zip", "no such file"), ("junk.zip", "not a readable zip or tar"),
                      ("empty.zip", "holds no")]:
        out = subprocess.run([*cmd, str(tmp_path / bad)], env=env, capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and says in out.stderr, out.stderr
        assert "json_2.1.2_tw-pddl.zip" in out.stderr  # where the archive comes from


def test_missing_files_error_names_the_variable_and_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError) as e:
        A.resolve_data_dir()
    message = str(e.value)
    assert "$ALFWORLD_DATA" in message and alfworld_data.UNPACK_COMMAND in message
    assert "json_2.1.2_tw-pddl.zip" in message and "\n" not in message
