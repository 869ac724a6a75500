"""Fixtures for the environment adapters' tests.

ALFWorld: the game files are never part of the repository. A session-scoped fixture unpacks the
needed splits of `json_2.1.1.tar.xz` (from `$ALFWORLD_TARBALL`, or `shared/` inside or beside
the checkout, as CI lays it) into a temporary folder; tests that need it skip when no tarball is found.
"""

from __future__ import annotations

import dataclasses
import os
import tarfile
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[2]
_TARBALL_NAME = "json_2.1.1.tar.xz"
_TARBALL_CANDIDATES = (
    _REPO / "shared" / "data" / "alfworld" / _TARBALL_NAME,
    _REPO.parent / "shared" / "data" / "alfworld" / _TARBALL_NAME,
)
# Splits unpacked whole; train only as a few task folders (its full size is ~330 MB).
ALFWORLD_FULL_SPLITS = ("valid_seen", "valid_unseen")
ALFWORLD_TRAIN_FOLDERS = 3


@dataclasses.dataclass(frozen=True)
class ALFWorldData:
    root: Path  # holds json_2.1.1/ (what $ALFWORLD_DATA points to)
    members: tuple[str, ...]  # every game-file path in the tarball, relative to json_2.1.1/
    train_folders: tuple[str, ...]  # the train task folders that were unpacked


def _find_tarball() -> Path | None:
    env = os.environ.get("ALFWORLD_TARBALL")
    for cand in ([Path(env)] if env else []) + list(_TARBALL_CANDIDATES):
        if cand.is_file():
            return cand
    return None


@pytest.fixture(scope="session")
def alfworld_tarball() -> Path:
    path = _find_tarball()
    if path is None:
        pytest.skip(f"ALFWorld game files ({_TARBALL_NAME}) not found; set $ALFWORLD_TARBALL")
    return path


@pytest.fixture(scope="session")
def alfworld_data(alfworld_tarball, tmp_path_factory) -> ALFWorldData:
    """Unpack valid_seen, valid_unseen and a few train folders in one pass over the tarball."""
    root = tmp_path_factory.mktemp("alfworld_data")
    prefix = "json_2.1.1/"
    members: list[str] = []
    train_folders: list[str] = []
    with tarfile.open(alfworld_tarball, mode="r:xz") as tar:
        for info in tar:
            name = info.name
            if not name.startswith(prefix):
                continue
            rel = name[len(prefix):]
            parts = rel.split("/")
            if info.isfile() and rel.endswith("/game.tw-pddl"):
                members.append(rel)
            if not (info.isfile() or info.isdir()) or len(parts) < 2 or not parts[1]:
                continue
            split, folder = parts[0], parts[1]
            wanted = split in ALFWORLD_FULL_SPLITS
            if split == "train":
                if folder not in train_folders and len(train_folders) < ALFWORLD_TRAIN_FOLDERS:
                    train_folders.append(folder)
                wanted = folder in train_folders
            if wanted:
                tar.extract(info, root, filter="data")
    return ALFWorldData(root=root, members=tuple(members), train_folders=tuple(train_folders))
