import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
# benchmarks/training: the training helpers the benchmarks and examples share
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))


@pytest.fixture
def small_chunks():
    """Shrinks the ring segment to 64 bytes so tiny tensors cross many windows:
    the multi-chunk path runs in every size sweep."""
    import fastpar

    old = fastpar._C._get_ring_segment_bytes()
    fastpar._C._set_ring_segment_bytes(64)
    yield
    fastpar._C._set_ring_segment_bytes(old)
