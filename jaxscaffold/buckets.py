"""Shape buckets: jitted programs compile once per distinct shape, so variable sizes are rounded
up to a few values (used by the sampler, the embedder, the batcher and the train step)."""

from __future__ import annotations


def pow2_bucket(n: int, minimum: int, *, per_octave: int = 1) -> int:
    """The smallest `minimum * 2**k` that is >= n; with `per_octave=2`, also `minimum * 1.5 *
    2**k` (k >= 1) between them (at most a third padding instead of a half, for twice the
    programs)."""
    if per_octave not in (1, 2):
        raise ValueError(f"per_octave={per_octave}: 1 (powers of two) or 2 (and 1.5x between)")
    b = minimum
    while b < n:
        if per_octave == 2 and b >= 2 * minimum and b // 2 * 3 >= n:
            return b // 2 * 3
        b *= 2
    return b
