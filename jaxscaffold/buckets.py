"""Shape buckets: jitted programs compile once per distinct shape, so variable sizes are rounded
up to a few values. The one place those values are made, for every program: the sampler's
prefill / decode lengths and cache windows, the embedder, the batcher and the train step."""

from __future__ import annotations

import bisect
from typing import Sequence


def pow2_bucket(n: int, minimum: int, *, per_octave: int = 1) -> int:
    """The smallest `minimum * 2**k` that is >= n; with `per_octave=2`, also `minimum * 1.5 *
    2**k` (k >= 1) between them (at most a third padding instead of a half, for twice the
    programs)."""
    _check(per_octave)
    b = minimum
    while b < n:
        if per_octave == 2 and b >= 2 * minimum and b // 2 * 3 >= n:
            return b // 2 * 3
        b *= 2
    return b


def ladder(lo: int, hi: int, *, per_octave: int = 1) -> tuple[int, ...]:
    """A bounded set of buckets: `lo * 2**k` below `hi` (with `per_octave=2`, `lo * 1.5 * 2**k`
    too, from k = 0), then `hi` itself. (16, 100) -> (16, 32, 64, 100); (128, 700, per_octave=2)
    -> (128, 192, 256, 384, 512, 700)."""
    _check(per_octave)
    out, b = [], lo
    while b < hi:
        out += [w for w in ((b, b * 3 // 2) if per_octave == 2 else (b,)) if w < hi]
        b *= 2
    return tuple(out) + (hi,)


def fit(n: int, buckets: Sequence[int], *, what: str = "a size", error: type[Exception] = ValueError) -> int:
    """The smallest of the (sorted) `buckets` that holds `n`; `error` when none does."""
    i = bisect.bisect_left(buckets, n)
    if i == len(buckets):
        raise error(f"{what} of {n} tokens exceeds the largest bucket {buckets[-1]}")
    return buckets[i]


def _check(per_octave: int) -> None:
    if per_octave not in (1, 2):
        raise ValueError(f"per_octave={per_octave}: 1 (powers of two) or 2 (and 1.5x between)")
