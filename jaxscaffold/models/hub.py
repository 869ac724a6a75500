"""A model given by name: `model.hf_path` / `model.tokenizer` as a local directory or a
Hugging Face hub id (`Qwen/Qwen3-4B`), resolved to a local directory through huggingface_hub.

A hub id is looked up in the hub's cache (`HF_HUB_CACHE`, default ~/.cache/huggingface/hub,
laid out as models--ORG--NAME/snapshots/HASH with refs/main naming the hash); when it is not
there and the process is online it is downloaded into that cache. `HF_HUB_OFFLINE=1` (the
default of dev.sh and the tests) never reaches the network: the cache alone answers.
"""

from __future__ import annotations

import os
import re

from jaxscaffold.models.hf_io import CheckpointError

# The files a run reads: weights, configs, the tokenizer. Hub repos often hold the same
# weights again as .bin / .pth / .gguf, which a snapshot would download for nothing.
CHECKPOINT_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]

# ORG/NAME with the hub's characters (letters, digits, '-', '_', '.'), nothing before or after.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ModelNotFoundError(CheckpointError):
    """Neither a local directory nor a hub id in the cache (or downloadable)."""


def is_hub_id(name: str) -> bool:
    """Whether `name` has the form of a hub id (ORG/NAME), not of a path."""
    return bool(_HUB_ID.match(name)) and not name.startswith((".", "/", "~"))


def offline() -> bool:
    """Whether HF_HUB_OFFLINE asks for no network access (as huggingface_hub reads it)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def resolve(name: str, field: str = "model.hf_path") -> str:
    """The local directory of `name`: itself when it is a directory, else the hub snapshot of
    the hub id `name` (from the cache; downloaded into it when online). Raises
    ModelNotFoundError with a one-line message naming `field` otherwise."""
    expanded = os.path.expanduser(name)
    if os.path.isdir(expanded):
        return expanded
    if not is_hub_id(name):
        raise ModelNotFoundError(f"checkpoint directory not found: {name} ({field}: a local HF checkpoint "
                                 "directory or a hub id such as 'Qwen/Qwen3-4B')")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return snapshot_download(name, allow_patterns=CHECKPOINT_FILES, local_files_only=offline())
    except LocalEntryNotFoundError:
        where = os.environ.get("HF_HUB_CACHE") or "the hub cache (~/.cache/huggingface/hub)"
        how = ("HF_HUB_OFFLINE is set: download it once online with "
               f"`hf download {name}`, or unset HF_HUB_OFFLINE" if offline()
               else "it could not be downloaded (no network?)")
        raise ModelNotFoundError(f"{field}={name!r}: no such directory, and no hub model of that id in {where}; "
                                 f"{how}") from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelNotFoundError(f"{field}={name!r}: no such directory, and the hub says: {first}") from None
