"""Where the project caches what it builds once (the offline tokenizer, env catalogues)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV_VAR = "JAXSCAFFOLD_CACHE"
DEFAULT_CACHE_ROOT = Path("~/.cache/jaxscaffold")


def default_cache_root() -> Path:
    """$JAXSCAFFOLD_CACHE if set, else ~/.cache/jaxscaffold."""
    return Path(os.environ.get(CACHE_ENV_VAR) or DEFAULT_CACHE_ROOT).expanduser()
