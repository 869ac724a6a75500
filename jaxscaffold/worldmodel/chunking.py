"""Texts cut into chunks an embedder reads whole: no chunk over its token limit, nothing dropped.

An embedder reads at most `limit` tokens of a text (MiniLM 256 word pieces, Qwen3-Embedding its
context); past that it ignores the rest, so two states that differ only in their tail would
embed alike. `split_text` cuts a longer text at the coarsest boundary that works: lines first,
then sentences (". "), then list items (", "), then bare commas (compact JSON's field
separator), then words, and characters only for a single run longer than the limit. The
pieces are packed greedily, in order, into chunks of at most `limit` tokens, counted with the
embedder's own tokenizer on the chunk itself. The chunks concatenate back to the text exactly.
"""

from __future__ import annotations

from typing import Callable

SEPARATORS = ("\n", ". ", ", ", ",", " ")

TokenCount = Callable[[str], int]


def split_text(text: str, count: TokenCount, limit: int) -> list[str]:
    """`text` as chunks of at most `limit` tokens (by `count`) whose concatenation is `text`;
    a text within the limit is its own single chunk."""
    if limit < 1:
        raise ValueError(f"a chunk limit must be at least one token, got {limit}")
    if count(text) <= limit:
        return [text]
    return _pack(_pieces(text, count, limit, 0), count, limit)


def _pieces(text: str, count: TokenCount, limit: int, level: int) -> list[str]:
    """`text` cut at SEPARATORS[level] (each piece keeps its separator), pieces still over the
    limit cut at the next finer separator, in order."""
    if count(text) <= limit:
        return [text]
    if level == len(SEPARATORS):
        return _cut_characters(text, count, limit)
    sep = SEPARATORS[level]
    parts = text.split(sep)
    parts = [p + sep for p in parts[:-1]] + [parts[-1]]
    out: list[str] = []
    for part in parts:
        if part:
            out += _pieces(part, count, limit, level + 1)
    return out


def _cut_characters(text: str, count: TokenCount, limit: int) -> list[str]:
    """The last resort for one unbroken run: the longest prefixes within the limit (bisection)."""
    out = []
    while text:
        lo, hi = 1, len(text)  # the longest prefix length in [lo, hi] within the limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if count(text[:mid]) <= limit:
                lo = mid
            else:
                hi = mid - 1
        out.append(text[:lo])
        text = text[lo:]
    return out


def _pack(pieces: list[str], count: TokenCount, limit: int) -> list[str]:
    """Consecutive pieces joined while the joined text stays within the limit."""
    chunks, current = [], ""
    for piece in pieces:
        if current and count(current + piece) > limit:
            chunks.append(current)
            current = piece
        else:
            current += piece
    if current:
        chunks.append(current)
    return chunks
