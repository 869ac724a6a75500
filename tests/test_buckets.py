import pytest

from jaxscaffold.buckets import fit, ladder, pow2_bucket


@pytest.mark.parametrize("minimum", [1, 16, 64])
@pytest.mark.parametrize("per_octave", [1, 2])
def test_bucket_is_the_smallest_allowed_size_that_fits(minimum, per_octave):
    allowed = sorted({minimum * 2**k for k in range(16)} |
                     ({minimum * 3 * 2**k for k in range(15)} if per_octave == 2 else set()))
    for n in range(0, 40 * minimum):
        assert pow2_bucket(n, minimum, per_octave=per_octave) == min(s for s in allowed if s >= max(n, minimum))


def test_bad_per_octave_is_a_clear_error():
    with pytest.raises(ValueError, match="per_octave"):
        pow2_bucket(10, 16, per_octave=3)


def test_ladders_are_octaves_or_half_octaves_up_to_the_bound():
    assert ladder(16, 256) == (16, 32, 64, 128, 256)
    assert ladder(16, 100) == (16, 32, 64, 100)
    assert ladder(128, 700, per_octave=2) == (128, 192, 256, 384, 512, 700)
    assert ladder(128, 256, per_octave=2) == (128, 192, 256)
    assert ladder(128, 64) == ladder(128, 64, per_octave=2) == (64,)  # the bound below the start
    for hi in range(1, 3000, 7):  # every ladder is sorted, distinct, and ends at its bound
        for per_octave in (1, 2):
            sizes = ladder(128, hi, per_octave=per_octave)
            assert list(sizes) == sorted(set(sizes)) and sizes[-1] == hi


def test_fit_takes_the_smallest_bucket_that_holds_n():
    sizes = (16, 32, 64, 100)
    assert [fit(n, sizes) for n in (0, 16, 17, 64, 65, 100)] == [16, 16, 32, 64, 100, 100]
    with pytest.raises(KeyError, match="a prefill of 101 tokens exceeds the largest bucket 100"):
        fit(101, sizes, what="a prefill", error=KeyError)
