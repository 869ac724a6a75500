import pytest

from jaxscaffold.buckets import pow2_bucket


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
