"""Shared by every test folder: tests/common (the harness, the one
multi-process worker, the references) on sys.path, the markers (`cuda`: the
CUDA shapes; `quick`: the quick tier, given by the table of
common/quick_tier.py), and the fixtures. Modules of benchmarks/ are imported
by path (common/bench_import.py), never through sys.path."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "common"))


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: runs on CUDA tensors (scripts/gpu_check.sh's multi-process phase "
                                       "selects these with -m cuda)")
    config.addinivalue_line("markers", "quick: the quick tier (bash tests/run.sh --quick), every feature once; "
                                       "chosen by the table of tests/common/quick_tier.py")


@pytest.hookimpl(tryfirst=True)  # before -m reads the markers
def pytest_collection_modifyitems(config, items):
    import quick_tier

    ids = [quick_tier.test_id(str(item.path), item.name) for item in items]
    for item, tid in zip(items, ids):
        if quick_tier.selects(tid):
            item.add_marker(pytest.mark.quick)
    # The table's entries in files collected whole must each name a test.
    whole = [os.path.join(str(config.invocation_params.dir), a) for a in config.args if "::" not in a]
    stale = quick_tier.stale_entries(ids, whole)
    if stale:
        raise pytest.UsageError("tests/common/quick_tier.py names tests that do not exist: " + ", ".join(stale))


def pytest_collection_finish(session):
    # The host emulation's programs compile from now on, beside the tests
    # before them (common/emulation_builds.py).
    import emulation_builds

    cases = [(item.callspec.params["program"], item.callspec.params["sanitizer"]) for item in session.items
             if item.path.name == emulation_builds.TEST_FILE and hasattr(item, "callspec")]
    if cases and not session.config.option.collectonly:
        emulation_builds.start(cases)


def pytest_sessionfinish(session):
    import emulation_builds

    emulation_builds.finish()


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


@pytest.fixture
def one_rank_group():
    """A fastpar group of this process alone (world size 1, a HashStore)."""
    import torch.distributed as dist

    import fastpar  # noqa: F401  registers the backend

    dist.init_process_group("fastpar", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()
