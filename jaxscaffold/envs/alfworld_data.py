"""ALFWorld's game files from an archive the user has, unpacked where the adapter reads them.

    python -m jaxscaffold.envs.alfworld_data unpack ARCHIVE [--to DIR]

ARCHIVE is ALFWorld's official release of the text games, `json_2.1.2_tw-pddl.zip` (the ALFWorld
GitHub releases, tag 0.4.0: https://github.com/alfworld/alfworld/releases; `alfworld-download`
fetches the same file), or a `.tar.xz` / `.tar.gz` / `.tar` of the same `game.tw-pddl` files.
Only the game files are unpacked, as `DIR/json_2.1.1/<split>/<task-folder>/<trial>/game.tw-pddl`;
DIR is `--to`, else `$ALFWORLD_DATA`, else ALFWorld's default `~/.cache/alfworld`: the folder
`$ALFWORLD_DATA` must name for the adapter (`jaxscaffold.envs.alfworld`) to find them.

Standard library only, so it runs before (or without) the rest of the set-up.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tarfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import Iterator

DATA_SUBDIR = "json_2.1.1"
SPLITS = ("train", "valid_seen", "valid_unseen")
GAME_FILE = "game.tw-pddl"
DEFAULT_DATA_DIR = "~/.cache/alfworld"  # ALFWorld's own default (alfworld.info)
ARCHIVE_SOURCE = ("json_2.1.2_tw-pddl.zip from ALFWorld's GitHub releases (tag 0.4.0, "
                  "https://github.com/alfworld/alfworld/releases)")
UNPACK_COMMAND = "python -m jaxscaffold.envs.alfworld_data unpack ARCHIVE"


class ArchiveError(ValueError):
    """An archive that cannot be read or holds no ALFWorld game files."""


def data_dir(given: str | os.PathLike | None = None) -> tuple[str, Path]:
    """(where it came from, the folder): `given`, else `$ALFWORLD_DATA`, else the default."""
    if given is not None:
        return "data_dir", Path(given).expanduser()
    if os.environ.get("ALFWORLD_DATA"):
        return "$ALFWORLD_DATA", Path(os.environ["ALFWORLD_DATA"]).expanduser()
    return "ALFWorld's default location", Path(DEFAULT_DATA_DIR).expanduser()


def game_path(name: str) -> str | None:
    """`<split>/<task-folder>/<trial>/game.tw-pddl` of an archive member named `name` (under
    any leading folders, e.g. `json_2.1.1/`), or None when it is not a game file."""
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if len(parts) < 4 or parts[-1] != GAME_FILE or parts[-4] not in SPLITS:
        return None
    rel = parts[-4:]
    if any(p in ("", ".", "..") or "/" in p for p in rel):
        return None
    return "/".join(rel)


def _members(archive: Path) -> Iterator[tuple[str, bytes]]:
    """(game path, contents) of each game file in a zip or tar archive."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                rel = None if info.is_dir() else game_path(info.filename)
                if rel is not None:
                    yield rel, z.read(info)
        return
    try:
        with tarfile.open(archive, mode="r:*") as tar:
            for info in tar:
                rel = game_path(info.name) if info.isfile() else None
                if rel is not None:
                    yield rel, tar.extractfile(info).read()
    except (tarfile.TarError, EOFError, OSError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ArchiveError(f"{archive}: not a readable zip or tar archive ({first}; the archive is "
                           f"{ARCHIVE_SOURCE})") from None


def unpack(archive: str | os.PathLike, dest: str | os.PathLike) -> dict[str, int]:
    """Writes the game files of `archive` under `dest/json_2.1.1/`; the count per split.
    Raises ArchiveError when the archive is unreadable or holds none."""
    archive, root = Path(archive).expanduser(), Path(dest).expanduser() / DATA_SUBDIR
    if not archive.is_file():
        raise ArchiveError(f"{archive}: no such file (the archive is {ARCHIVE_SOURCE})")
    counts: collections.Counter = collections.Counter()
    for rel, data in _members(archive):
        path = root / rel  # game_path admits only plain names under a known split
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        counts[rel.split("/")[0]] += 1
    if not counts:
        raise ArchiveError(f"{archive}: holds no <split>/<task-folder>/<trial>/{GAME_FILE} files "
                           f"(the archive is {ARCHIVE_SOURCE})")
    return {s: counts[s] for s in SPLITS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxscaffold.envs.alfworld_data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("unpack", help="unpack the game files of ARCHIVE")
    p.add_argument("archive", help="json_2.1.2_tw-pddl.zip (or a .tar.xz of the same files)")
    p.add_argument("--to", default=None, help="the data folder (default: $ALFWORLD_DATA, else ~/.cache/alfworld)")
    args = parser.parse_args(argv)
    _, dest = data_dir(args.to)
    try:
        counts = unpack(args.archive, dest)
    except (ArchiveError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"unpacked {sum(counts.values())} ALFWorld games ({', '.join(f'{s} {n}' for s, n in counts.items())}) "
          f"into {dest / DATA_SUBDIR}")
    if data_dir()[1] != dest:  # the adapter would not look there by itself
        print(f"use them with: export ALFWORLD_DATA={dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
