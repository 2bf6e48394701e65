"""Shared by every test folder: tests/common (the harness, the one
multi-process worker, the references) and benchmarks/training (the training
helpers the benchmarks and examples share) on sys.path, the marker of the
CUDA shapes, and the fixtures."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "common"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: runs on CUDA tensors (scripts/gpu_check.sh's multi-process phase "
                                       "selects these with -m cuda)")


@pytest.fixture
def no_leftover_segments():
    """A test's processes leave no fastpar segment in /dev/shm, whatever
    happened to them (use with pytest.mark.usefixtures)."""
    from dist_harness import shm_entries

    before = shm_entries()
    yield
    assert shm_entries() - before == set(), "fastpar segments left in /dev/shm"


@pytest.fixture
def small_chunks():
    """Shrinks the ring segment to 64 bytes so tiny tensors cross many windows:
    the multi-chunk path runs in every size sweep."""
    import fastpar

    old = fastpar._C._testing.ring_segment_bytes()
    fastpar._C._testing.set_ring_segment_bytes(64)
    yield
    fastpar._C._testing.set_ring_segment_bytes(old)
