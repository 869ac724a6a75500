"""DAPO overlong shaping (vs the reference, at its boundaries) and the dynamic sampler."""

import numpy as np
import pytest

from jaxscaffold.rl.dapo import DynamicSampler, DynamicSamplingExhausted, informative, overlong_penalty
from tests.rl import numpy_reference as ref


@pytest.mark.parametrize("max_len,buffer,factor", [(2048, 512, 1.0), (100, 20, 0.5), (10, 10, 2.0)])
def test_overlong_penalty_at_boundaries(max_len, buffer, factor):
    start = max_len - buffer
    lengths = [0, start - 1, start, start + 1, start + buffer // 2, max_len - 1, max_len, max_len + 7]
    lengths = [n for n in lengths if n >= 0]
    got = overlong_penalty(np.array(lengths), max_len, buffer, factor)
    want = [ref.overlong_penalty(n, max_len, buffer, factor) for n in lengths]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert got[lengths.index(start)] == 0.0  # no penalty up to max_len - buffer tokens
    assert got[lengths.index(max_len)] == -factor  # full penalty at the limit
    np.testing.assert_allclose(got[lengths.index(start + buffer // 2)], -factor * (buffer // 2) / buffer)


def test_overlong_penalty_rejects_bad_buffer():
    for buffer in (0, -1, 11):
        with pytest.raises(ValueError, match="buffer"):
            overlong_penalty([5], max_len=10, buffer=buffer)


def groups(*rows):
    return [np.array(r) for r in rows]


def test_sampler_drops_uninformative_groups_and_fills_across_batches():
    s = DynamicSampler(target_groups=3, max_num_gen_batches=5)
    kept = s.add(groups([0, 0, 0], [1, 0, 1], [1, 1, 1], [True, True]), payloads=["z", "A", "o", "o2"])
    assert kept == 1 and not s.full()
    assert (s.num_dropped_all_zero, s.num_dropped_all_one, s.num_dropped) == (1, 2, 3)
    kept = s.add(groups([0, 0], [1], [0, 1, 0]), payloads=["z2", "solo", "B"])  # a group of one is dropped
    assert kept == 1 and not s.full()
    kept = s.add(groups([1, 0], [0, 0, 1], [0, 1]), payloads=["C", "D", "E"])  # D, E overflow
    assert kept == 1 and s.full()
    out = s.take()
    assert out.payloads == ["A", "B", "C"]
    assert [x.tolist() for x in out.successes] == [[1, 0, 1], [0, 1, 0], [1, 0]]
    assert (out.num_gen_batches, out.num_seen, out.num_overflow) == (3, 10, 2)
    assert (out.num_dropped_all_zero, out.num_dropped_all_one, out.num_dropped) == (2, 3, 5)
    # take() resets for the next step.
    assert s.num_kept == 0 and s.num_gen_batches == 0 and not s.full()


def test_sampler_raises_after_max_generation_batches():
    s = DynamicSampler(target_groups=4, max_num_gen_batches=3)
    s.add(groups([0, 1], [1, 1]))
    s.add(groups([0, 0], [0, 0]))
    with pytest.raises(DynamicSamplingExhausted, match=r"1/4 informative groups after 3 generation batches") as e:
        s.add(groups([1, 1, 1]))
    assert "dropped 4 of 5 groups (2 all-fail, 2 all-success)" in str(e.value)


def test_sampler_filling_on_the_last_allowed_batch_is_fine():
    s = DynamicSampler(target_groups=2, max_num_gen_batches=2)
    s.add(groups([0, 0]))
    s.add(groups([0, 1], [1, 0]))
    assert s.full() and len(s.take().payloads) == 2


def test_sampler_without_limit_keeps_going():
    s = DynamicSampler(target_groups=1, max_num_gen_batches=0)
    for _ in range(25):
        s.add(groups([1, 1]))
    s.add(groups([1, 0]), payloads=[{"rollouts": 42}])
    assert s.take().payloads == [{"rollouts": 42}]


def test_sampler_insists_on_binary_success_and_its_protocol():
    s = DynamicSampler(target_groups=1)
    with pytest.raises(ValueError, match="BINARY"):
        s.add(groups([1.0, 0.8]))  # a shaped reward, not a success flag
    with pytest.raises(ValueError, match="payloads"):
        s.add(groups([1, 0]), payloads=[1, 2])
    with pytest.raises(RuntimeError, match="keep adding"):
        s.take()
    s.add(groups([1, 0]))
    with pytest.raises(RuntimeError, match="take"):
        s.add(groups([1, 0]))
    with pytest.raises(ValueError):
        DynamicSampler(target_groups=0)
    assert informative([0, 1]) and not informative([1, 1]) and not informative([0])


def test_sampler_taken_partial_gives_the_groups_it_has():
    """Generation stopped short of the target (the reference trains on what it has): `take`
    with `partial` returns the kept groups and the counts; without it, it still insists."""
    s = DynamicSampler(target_groups=3, max_num_gen_batches=0)
    s.add(groups([0, 1], [1, 1]), payloads=["A", "all-one"])
    s.add(groups([0, 0], [1, 0]), payloads=["all-zero", "B"])
    with pytest.raises(RuntimeError, match="keep adding"):
        s.take()
    out = s.take(partial=True)
    assert out.payloads == ["A", "B"] and (out.num_gen_batches, out.num_seen, out.num_dropped) == (2, 4, 2)
    assert s.num_kept == 0 and s.take(partial=True).payloads == []
