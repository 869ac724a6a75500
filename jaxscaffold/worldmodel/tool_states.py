"""tau2's next states: tool results, each inside `<tool_response>\\n...\\n</tool_response>` (one
block per call of the step), holding JSON (retail and airline records, lists of flights) or
text (telecom's phone: "Airplane Mode is now OFF.\\nStatus Bar: ...", "Error: ...").

The calibration's (experiments/calibration) near misses, paraphrases and echo template, the facts of the
`embedding_facts` reward, read such a state block by block through these helpers; a bare JSON
text (no wrapper) counts as one block.
"""

from __future__ import annotations

import json
import random
import re
from typing import Callable

_BLOCK = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)
# telecom's device states: a word and its opposite (either direction is a near miss)
TEXT_FLIPS = [("ON", "OFF"), ("Enabled", "Disabled"), ("enabled", "disabled"), ("Connected", "Disconnected"),
              ("successful", "failed"), ("True", "False")]
# meaning-preserving rewrites of tau2's tool text (the facts stay)
TEXT_SYNONYMS = [("is now", "has been switched"), ("Status Bar:", "Status bar:"), ("Error: ", "Error - ")]


def blocks(text: str) -> list[str] | None:
    """The contents of a state made only of tool-response blocks (a bare JSON text: itself),
    else None."""
    stripped = text.strip()
    found = _BLOCK.findall(stripped)
    if found and _BLOCK.sub("", stripped).strip() == "":
        return found
    if stripped[:1] in "[{":
        try:
            json.loads(stripped)
            return [stripped]
        except ValueError:
            return None
    return None


def rebuild(text: str, contents: list[str]) -> str:
    """`text` (a state `blocks` read) with its blocks' contents replaced, in order."""
    if not _BLOCK.search(text):  # a bare JSON text
        return contents[0]
    it = iter(contents)
    return _BLOCK.sub(lambda m: f"<tool_response>\n{next(it)}\n</tool_response>", text)


def parse_json(content: str):
    """The JSON value of a block's content, or None (text content)."""
    if content.strip()[:1] not in "[{":
        return None
    try:
        return json.loads(content)
    except ValueError:
        return None


def dump(value) -> str:
    """tau2's serialisation of a tool result (json.dumps, non-ASCII kept)."""
    return json.dumps(value, ensure_ascii=False)


def _shuffle_keys(value, rng: random.Random):
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffle_keys(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffle_keys(v, rng) for v in value]
    return value


def paraphrase(text: str, seed: int) -> str | None:
    """The same tool results written otherwise: each JSON block's object keys in another order
    (the facts are sets: order is free), text blocks with synonyms; None if `text` is no tool
    state."""
    contents = blocks(text)
    if contents is None:
        return None
    rng = random.Random(seed)
    out = []
    for c in contents:
        value = parse_json(c)
        if value is not None:
            out.append(dump(_shuffle_keys(value, rng)))
        else:
            for a, b in TEXT_SYNONYMS:
                c = c.replace(a, b)
            out.append(c)
    return rebuild(text, out)


def _leaves(value, path, key_filter, out):
    if isinstance(value, dict):
        for k, v in value.items():
            _leaves(v, path + [k], key_filter, out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _leaves(v, path + [i], key_filter, out)
    elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
        key = next((p for p in reversed(path) if isinstance(p, str)), "")
        if key_filter(key):
            out.append(path)


def _changed(old, key: str):
    if isinstance(old, (int, float)):
        return old + 1
    if "status" in key:
        return "cancelled" if old != "cancelled" else "pending"
    return old[:-1] + ("X" if old[-1:] != "X" else "Y") if old else "X"


def change_json_leaf(text: str, draw: Callable[[int], int], key_filter: Callable[[str], bool]) -> str | None:
    """One scalar leaf of one JSON block changed (a number + 1, a status to another status, a
    string's last character), among the leaves whose nearest key passes `key_filter`; `draw(n)`
    picks an index below n. None when there is no such leaf."""
    contents = blocks(text)
    if contents is None:
        return None
    candidates = []
    for i, c in enumerate(contents):
        value = parse_json(c)
        if value is None:
            continue
        paths: list = []
        _leaves(value, [], key_filter, paths)
        candidates += [(i, value, p) for p in paths]
    if not candidates:
        return None
    i, value, path = candidates[draw(len(candidates))]
    parent = value
    for p in path[:-1]:
        parent = parent[p]
    key = next((p for p in reversed(path) if isinstance(p, str)), "")
    parent[path[-1]] = _changed(parent[path[-1]], key)
    contents = list(contents)
    contents[i] = dump(value)
    return rebuild(text, contents)


_NUMBER = re.compile(r"\d+")


def change_text(text: str, draw: Callable[[int], int]) -> str | None:
    """One text block's device state flipped (ON <-> OFF, Enabled <-> Disabled, ...) or, where
    nothing flips, one number changed; None when no text block has either."""
    contents = blocks(text)
    if contents is None:
        return None
    edits = []
    for i, c in enumerate(contents):
        if parse_json(c) is not None:
            continue
        flips = [(i, m.start(), m.end(), b if m.group(1) == a else a)
                 for a, b in TEXT_FLIPS for m in re.finditer(rf"\b({a}|{b})\b", c)]
        edits += flips or [(i, m.start(), m.end(), str(int(m.group()) + 1)) for m in _NUMBER.finditer(c)]
    if not edits:
        return None
    i, start, end, new = edits[draw(len(edits))]
    contents = list(contents)
    contents[i] = contents[i][:start] + new + contents[i][end:]
    return rebuild(text, contents)


def call_echo(action: str) -> str | None:
    """A tool-call 'prediction' that knows nothing of the world: each call's own arguments
    written back as its result, in the tool-response format; None for an action without calls."""
    calls = re.findall(r"<tool_call>\s*(.*?)\s*</tool_call>", action, re.DOTALL)
    if not calls:
        return None
    out = []
    for c in calls:
        try:
            args = json.loads(c).get("arguments", {})
        except (ValueError, AttributeError):
            args = {}
        out.append(f"<tool_response>\n{dump(args)}\n</tool_response>")
    return "\n".join(out)
