"""Named seed streams: reproducible, distinct per name and key, 32-bit, and bad names are errors."""

import pytest

from jaxscaffold import seeds


def test_streams_are_reproducible_distinct_and_32_bit():
    values = {(name, k): seeds.derive(0, name, k) for name in seeds.STREAMS for k in range(1, 4)}
    assert len(set(values.values())) == len(values)  # no two (name, key) share a seed
    assert all(0 <= v < 2**32 for v in values.values())
    assert seeds.derive(0, "eval") == seeds.derive(0, "eval")  # a function of its inputs only
    assert seeds.derive(0, "eval") != seeds.derive(1, "eval")
    assert seeds.derive(-1, "eval") == seeds.derive(2**32 - 1, "eval")  # run seeds count mod 2^32
    assert seeds.derive(5, "rollout") == seeds.derive(5, "rollout", 0)  # trailing zero keys do not count
    # Stable across processes and versions (a hash of the name, not Python's salted `hash`).
    assert seeds.derive(0, "eval") == 922246338 and seeds.derive(0, "rollout", 1) == 2315123917


def test_unknown_stream_or_negative_key_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown seed stream 'evl'"):
        seeds.derive(0, "evl")
    with pytest.raises(ValueError, match="non-negative"):
        seeds.derive(0, "rollout", -1)
