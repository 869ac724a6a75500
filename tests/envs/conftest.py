"""Fixtures for the environment adapters' tests.

ALFWorld: the game files are never part of the repository. The tests read them where a run
does: `$ALFWORLD_DATA` (else ALFWorld's default ~/.cache/alfworld), filled once with
`python -m jaxscaffold.envs.alfworld_data unpack ARCHIVE`; tests that need them skip, with the
adapter's own message, when they are not there.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from jaxscaffold.envs import alfworld_data as data


@dataclasses.dataclass(frozen=True)
class ALFWorldData:
    root: Path  # holds json_2.1.1/ (what $ALFWORLD_DATA points to)
    members: tuple[str, ...]  # every game-file path, relative to json_2.1.1/
    train_folders: tuple[str, ...]  # the train task folders present


@pytest.fixture(scope="session")
def alfworld_data() -> ALFWorldData:
    """The unpacked game files of `$ALFWORLD_DATA`, listed once."""
    from jaxscaffold.envs.alfworld import resolve_data_dir

    try:
        games = resolve_data_dir()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    members = sorted(str(p.relative_to(games)) for s in data.SPLITS for p in (games / s).glob(f"*/*/{data.GAME_FILE}"))
    train = sorted({m.split("/")[1] for m in members if m.startswith("train/")})
    return ALFWorldData(root=games.parent, members=tuple(members), train_folders=tuple(train))
