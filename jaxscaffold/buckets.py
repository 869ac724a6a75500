"""Shape buckets: jitted programs compile once per distinct shape, so variable sizes are rounded
up to a few values (used by the sampler, the embedder, the batcher and the train step)."""

from __future__ import annotations


def pow2_bucket(n: int, minimum: int) -> int:
    """The smallest `minimum * 2**k` that is >= n."""
    b = minimum
    while b < n:
        b *= 2
    return b
