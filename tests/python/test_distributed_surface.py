"""The torch.distributed surface beyond the classic collectives (the *_single
and coalesced forms, coalescing blocks, gather into one tensor, mixed
batch_isend_irecv, monitored barrier) on every device fastpar serves, and the
table of c10d::Backend methods in docs/c10d_methods.md against the installed
torch."""
import os
import re

import pytest
import torch

import fastpar
from dist_harness import assert_ok, run, shm_entries

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEVICES = ["cpu"] + (["cuda"] if fastpar._C.built_with_cuda and torch.cuda.is_available() else [])


@pytest.fixture(autouse=True)
def no_leftover_segments():
    before = shm_entries()
    yield
    assert shm_entries() - before == set(), "fastpar segments left in /dev/shm"


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("device", DEVICES)
def test_surface(device, world):
    assert_ok(run("surface", world, env={"FASTPAR_TEST_DEVICE": device}, timeout=120))


def test_monitored_barrier_names_the_late_rank():
    results = run("monitored_barrier_timeout", 3, timeout=60)
    assert_ok(results)
    assert "[Rank 0]: Rank 2 failed to pass monitoredBarrier in 1000 ms" in results[0].out, results[0].out
