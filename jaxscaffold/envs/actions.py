"""Shared parsing of agent output of the form ``<think>...</think> <action>...</action>``.

Model text is untrusted: this module only slices strings (bounded regex work on a capped
input); nothing here evaluates, executes or shells out.

Usage by an adapter::

    parsed = parse_action(model_text)
    if parsed.action is None:
        return invalid observation with invalid_action_message(parsed.error)
    ... send parsed.action to the simulator ...

Rules (see `parse_action`):
- the input is capped to its last `max_chars` characters (the action normally comes last),
  NFC-normalised, and control / invisible format characters are removed;
- tags are case-insensitive and tolerate inner whitespace (``< Action >``, ``</ action>``);
- the *last* well-formed block wins: the last ``<action>`` followed by a ``</action>``, up to
  the first such close (``<action>a <action>b</action>`` gives ``b``;
  ``<action>a</action> b</action>`` gives ``a``);
- an unclosed trailing ``<action>`` (a sampler that strips the stop string ``</action>``) is
  accepted only with ``allow_unclosed=True``;
- the action is stripped, its whitespace collapsed to single spaces, and one layer of
  surrounding quotes / backticks removed; empty or over-long actions are rejected;
- ``think`` is the last complete ``<think>`` block before the action, or, when only a closing
  ``</think>`` exists (Qwen3 templates open the block in the prompt), everything before it.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
import unicodedata

__all__ = ["ParsedAction", "parse_action", "invalid_action_message", "clean_text", "action_of", "action_text",
           "strip_reasoning"]

DEFAULT_MAX_CHARS = 32_768  # input characters examined (the tail of the text)
DEFAULT_MAX_ACTION_CHARS = 512  # longest accepted action
_MAX_THINK_CHARS = 16_384  # think text kept (it is informational only)

_QUOTES = ("`", '"', "'", "\u201c", "\u201d", "\u2018", "\u2019")


@dataclasses.dataclass(frozen=True)
class ParsedAction:
    """Result of `parse_action`. `action` is None exactly when `error` is set."""

    think: str | None
    action: str | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.action is not None


def clean_text(text: str) -> str:
    """NFC-normalise and drop control characters (except newline / tab) and invisible format
    characters (zero-width spaces, bidi overrides, BOM)."""
    text = unicodedata.normalize("NFC", text)
    return "".join(
        ch
        for ch in text
        if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Co", "Cn")
    )


def _tag_patterns(tag: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_\-]*", tag):
        raise ValueError(f"bad tag name {tag!r}")
    name = re.escape(tag)
    return (
        re.compile(rf"<\s*{name}\s*>", re.IGNORECASE),
        re.compile(rf"<\s*/\s*{name}\s*>", re.IGNORECASE),
    )


_PATTERNS: dict[str, tuple[re.Pattern[str], re.Pattern[str]]] = {}


def _patterns(tag: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    if tag not in _PATTERNS:
        _PATTERNS[tag] = _tag_patterns(tag)
    return _PATTERNS[tag]


def _normalise_action(raw: str) -> str:
    action = " ".join(raw.split())
    for _ in range(2):  # e.g. "`'go to kitchen'`"
        if len(action) >= 2 and action[0] in _QUOTES and action[-1] in _QUOTES:
            action = action[1:-1].strip()
    return action


def _extract_think(text: str, end: int) -> str | None:
    """The last complete <think> block in text[:end], else text before a lone </think>."""
    open_re, close_re = _patterns("think")
    head = text[:end]
    closes = list(close_re.finditer(head))
    if not closes:
        return None
    last_close = closes[-1]
    opens = [m for m in open_re.finditer(head, 0, last_close.start())]
    start = opens[-1].end() if opens else 0
    think = head[start : last_close.start()].strip()
    return think[:_MAX_THINK_CHARS]


def parse_action(
    text: object,
    *,
    tag: str = "action",
    max_chars: int = DEFAULT_MAX_CHARS,
    max_action_chars: int = DEFAULT_MAX_ACTION_CHARS,
    allow_unclosed: bool = False,
) -> ParsedAction:
    """Extract the last well-formed ``<tag>...</tag>`` (default ``<action>``) and the think text.

    Pure and bounded: at most `max_chars` characters (the tail) are examined. Never raises on
    any input; returns ``ParsedAction(think, None, error)`` with a short reason when no action
    can be extracted.
    """
    if not isinstance(text, str):
        return ParsedAction(None, None, f"output is not text ({type(text).__name__})")
    if max_chars > 0 and len(text) > max_chars:
        text = text[-max_chars:]
    text = clean_text(text)
    open_re, close_re = _patterns(tag)

    closes = list(close_re.finditer(text))
    opens = list(open_re.finditer(text))
    close_starts = [m.start() for m in closes]
    span: tuple[int, int] | None = None  # (content start, content end)
    open_start = 0
    # The last opening tag that has a closing tag after it, paired with the first such close.
    for m in reversed(opens):
        k = bisect.bisect_left(close_starts, m.end())
        if k < len(closes):
            span = (m.end(), closes[k].start())
            open_start = m.start()
            break
    if allow_unclosed and opens:
        last_open = opens[-1]
        if not closes or last_open.start() >= closes[-1].end():
            span = (last_open.end(), len(text))
            open_start = last_open.start()

    if span is None:
        think = _extract_think(text, len(text))
        if opens and not closes:
            return ParsedAction(think, None, f"unclosed <{tag}> tag (missing </{tag}>)")
        if closes and not opens:
            return ParsedAction(think, None, f"</{tag}> without an opening <{tag}>")
        if opens and closes:
            return ParsedAction(think, None, f"no <{tag}>...</{tag}> block in the right order")
        return ParsedAction(think, None, f"no <{tag}>...</{tag}> found in the output")

    think = _extract_think(text, open_start)
    raw = text[span[0] : span[1]]
    if len(raw) > 4 * max_action_chars:  # cheap early reject before normalising
        return ParsedAction(think, None, f"action longer than {max_action_chars} characters")
    action = _normalise_action(raw)
    if not action:
        return ParsedAction(think, None, f"empty <{tag}>")
    if len(action) > max_action_chars:
        return ParsedAction(think, None, f"action longer than {max_action_chars} characters")
    return ParsedAction(think, action, None)


def invalid_action_message(error: str | None, *, tag: str = "action") -> str:
    """The observation text an adapter returns for output it could not parse."""
    reason = error or "no action found"
    return (
        f"Invalid output: {reason}. Think inside <think>...</think>, then give exactly one "
        f"action inside <{tag}>...</{tag}>."
    )


def action_of(text: str) -> str:
    """The action an agent's text names, as the tag envs report it (`StepResult.action`): the
    `<action>` content, else the whole text stripped."""
    parsed = parse_action(text)
    return parsed.action if parsed.action is not None else text.strip()


def action_text(action: str) -> str:
    """The text a scripted agent writes to take `action` in an `<action>`-format env."""
    return f"<action>{action}</action>"


def strip_reasoning(text: str) -> str:
    """The answer after Qwen3's reasoning: reasoning is a prefix (`<think>...</think>`, or an
    unclosed prefix when the template opened the block in the prompt) and ends at the FIRST
    `</think>`, as Qwen3's reasoning parsers (vLLM, SGLang) read it; everything after is the
    answer verbatim, so a `</think>` inside a string argument stays in the call. (Without
    reasoning, an answer's own first `</think>` is still read as its end, as those parsers do.)"""
    _, sep, answer = text.partition("</think>")
    return answer if sep else text
