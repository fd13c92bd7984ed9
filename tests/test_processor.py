"""`keras_tfm.processor`: what the machine's processor is, read from /proc/cpuinfo's text."""

import pytest

from keras_tfm import processor

INTEL = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu avx2 avx512f avx512_vnni\n\nprocessor\t: 1\n"
AMD = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 avx512f\n"


@pytest.mark.backend_independent
def test_the_maker_and_flags_are_those_of_the_first_processor():
    intel, amd = processor.cpu_fields(INTEL), processor.cpu_fields(AMD)
    assert processor.made_by_intel(intel) and not processor.made_by_intel(amd)
    assert processor.cpu_flags(intel) == {"fpu", "avx2", "avx512f", "avx512_vnni"}
    assert "avx512_vnni" not in processor.cpu_flags(amd)
    assert processor.cpu_fields("") == {} and processor.cpu_flags({}) == set()
