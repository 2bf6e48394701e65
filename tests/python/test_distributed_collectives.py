"""Correctness of every fastpar collective against a pure-torch reference, in
real processes over shared memory. A 4 KiB slot (FASTPAR_SHM_SLOT_BYTES) makes
the larger sizes cross many chunks, and both allreduce schedules run (auto, and
each one forced). Each world size is one launch running several scenarios:
starting Python + torch dominates the time on a loaded 2-core machine."""
import pytest

from dist_harness import assert_ok, run, shm_entries

# Registered buffers of every size take the zero-copy schedule (by default only >= 16 MiB do).
SMALL_SLOT = {"FASTPAR_SHM_SLOT_BYTES": "4096", "FASTPAR_SHM_REGISTERED_BYTES": str(4 << 20),
              "FASTPAR_SHM_REGISTERED_MIN_BYTES": "0"}
PARTS = {
    2: ["bad_input", "allreduce", "allreduce_one_shot", "allreduce_two_shot", "collectives", "registered",
        "avg_integers"],
    3: ["allreduce", "collectives", "registered", "avg_integers"],
    4: ["allreduce", "registered"],
}


@pytest.fixture(autouse=True)
def no_leftover_segments():
    before = shm_entries()
    yield
    assert shm_entries() - before == set(), "fastpar segments left in /dev/shm"


@pytest.mark.parametrize("world", [2, 3, 4])
def test_collectives_against_torch_reference(world):
    # one-shot only up to 64 B: above it registered buffers take their own schedule
    env = {**SMALL_SLOT, "FASTPAR_SHM_ONESHOT_MAX_BYTES": "64"} if world == 4 else SMALL_SLOT
    results = run("suite", world, env=env, args=PARTS[world], timeout=170)
    assert_ok(results)
    for part in PARTS[world]:
        assert f"{part}: ok" in results[0].out, results[0].out
    if world == 2:
        assert "fastpar.all_reduce: tensors[0] must be contiguous" in results[0].out
