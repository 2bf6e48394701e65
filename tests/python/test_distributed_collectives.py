"""Correctness of every fastpar collective against a pure-torch reference, in
real processes over shared memory. A 4 KiB slot (FASTPAR_SHM_SLOT_BYTES) makes
the larger sizes cross many chunks and both allreduce schedules run."""
import pytest

from dist_harness import assert_ok, run, shm_entries

SMALL_SLOT = {"FASTPAR_SHM_SLOT_BYTES": "4096", "FASTPAR_SHM_REGISTERED_BYTES": str(4 << 20)}


@pytest.fixture(autouse=True)
def no_leftover_segments():
    before = shm_entries()
    yield
    assert shm_entries() - before == set(), "fastpar segments left in /dev/shm"


@pytest.mark.parametrize("world", [2, 3, 4])
def test_allreduce_all_dtypes_ops_sizes(world):
    assert_ok(run("allreduce", world, env=SMALL_SLOT))


@pytest.mark.parametrize("algo", ["one_shot", "two_shot"])
def test_allreduce_forced_schedule(algo):
    # one_shot still falls back to two-shot above the slot size, two_shot covers tiny sizes
    assert_ok(run("allreduce", 2, env={**SMALL_SLOT, "FASTPAR_SHM_ALLREDUCE": algo}, args=[0, 1, 33, 999]))


@pytest.mark.parametrize("world", [2, 3])
def test_other_collectives(world):
    assert_ok(run("collectives", world, env=SMALL_SLOT, timeout=150))


@pytest.mark.parametrize("world", [2, 4])
def test_registered_buffers(world):
    # one-shot only up to 64 B so the registered two-shot runs for all but the tiniest
    assert_ok(run("registered", world, env={**SMALL_SLOT, "FASTPAR_SHM_ONESHOT_MAX_BYTES": "64"}))


def test_bad_input_messages():
    results = run("bad_input", 2)
    assert_ok(results)
    assert "fastpar.all_reduce: tensors[0] must be contiguous" in results[0].out
