"""The partial-rollout swap measurement on a minimal setting: re-prefilling makes the recorded
log-probs the new weights' (to numerics); keeping the cache leaves a gap below one version's drift."""

import pytest

from experiments.partial_swap.measure import measure


@pytest.mark.slow  # ~60 s: four driver runs of the tiny model
def test_reprefill_is_exact_and_the_kept_cache_lies_between_the_versions():
    out = measure(rows=2, max_new_tokens=8, chunk=4, turns=2, swap_chunk=2, eps=0.05)
    keep, exact = out["keep"], out["reprefill"]
    assert keep["tokens_after_swap"] > 0 and exact["tokens_after_swap"] > 0
    assert exact["keep_error"] < 1e-4 < keep["keep_error"]
    assert keep["keep_error"] < keep["drift"]  # the kept cache moves a token part of the way only
    assert keep["swap_s"] > 0 and exact["swap_s"] > 0
