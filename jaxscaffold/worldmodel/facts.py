"""The checkable facts of an environment state: what a prediction must get exactly right.

A sentence embedder barely moves when one fact of a state changes (measured with MiniLM on
real ALFWorld transitions: a flipped open / closed passes tau_d 0.14 every time, a wrong
object number 92% of the time, an action-echo template earns 0.57), so the
`embedding_facts` reward also requires the prediction's facts to equal the real state's:

- text states (ALFWorld): the numbered objects named ("apple 2", "drawer 17"), the states
  asserted ("is open", "is closed" / "shut", "is on" / "off"), the outcome verbs ("You open",
  "You pick up", ...), and whether something is "nothing";
- JSON states (tau2's tool results): every scalar leaf with its key (ids, statuses, values);
  a state of `<tool_response>` blocks (`tool_states`) block by block: a JSON block's leaves, a
  text block's (telecom's phone) numbers and ids, upper-case words (ON / OFF, LTE), the
  device-state words of `tool_states.TEXT_FLIPS`, and whether it is an error.

Facts are sets: the order of a listing and repeated mentions do not count, wording outside
them is the embedding's to judge.
"""

from __future__ import annotations

import json
import re

from jaxscaffold.worldmodel import tool_states

_OBJECT = re.compile(r"\b([a-z]+) (\d+)\b")
_STATE = re.compile(r"\b(?:is|are|now) (?:now )?(open|closed|shut|on|off|clean|hot|cool|cold|sliced)\b")
_VERB = re.compile(r"\byou (open|close|turn on|turn off|pick up|take|put|place|move|clean|heat|cool|slice|arrive at|reach)\b")
_CANONICAL = {"shut": "closed", "cold": "cool", "take": "pick up", "move": "put", "place": "put", "reach": "arrive at"}


def _json_facts(value) -> frozenset:
    out = set()

    def walk(node, key):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, str(k))
        elif isinstance(node, list):
            for v in node:
                walk(v, key)
        else:
            out.add((key, json.dumps(node)))
    walk(value, "")
    return frozenset(out)


_TOOL_TOKEN = re.compile(r"[\w#.:-]*\d[\w#.:-]*|\b[A-Z][A-Z0-9]+\b")
_FLIP_WORDS = {w for pair in tool_states.TEXT_FLIPS for w in pair}


def _tool_text_facts(content: str) -> set:
    facts = {("token", w.rstrip(".:")) for w in _TOOL_TOKEN.findall(content)}
    facts |= {("word", w) for w in re.findall(r"\w+", content) if w in _FLIP_WORDS}
    if content.lstrip().startswith("Error"):
        facts.add(("error", ""))
    return facts


def _block_facts(content: str) -> frozenset | set:
    value = tool_states.parse_json(content)
    return _json_facts(value) if value is not None else _tool_text_facts(content)


def state_facts(text: str) -> frozenset:
    """The facts of one state's text (see the module's docstring)."""
    stripped = text.strip()
    contents = tool_states.blocks(stripped) if stripped.startswith("<tool_response>") else None
    if contents is not None:
        return frozenset((i, f) for i, c in enumerate(contents) for f in _block_facts(c))
    if stripped[:1] in "[{":
        try:
            return _json_facts(json.loads(stripped))
        except ValueError:
            pass
    low = text.lower()
    facts = {("object", f"{n} {i}") for n, i in _OBJECT.findall(low)}
    facts |= {("state", _CANONICAL.get(s, s)) for s in _STATE.findall(low)}
    facts |= {("outcome", _CANONICAL.get(v, v)) for v in _VERB.findall(low)}
    if re.search(r"\bnothing\b", low):
        facts.add(("nothing", ""))
    return frozenset(facts)


def same_facts(prediction: str, target: str) -> bool:
    return state_facts(prediction) == state_facts(target)
