"""The torch.distributed surface beyond the classic collectives (the *_single
and coalesced forms, coalescing blocks, gather into one tensor, mixed
batch_isend_irecv, monitored barrier) on every device fastpar serves (CUDA
where this machine has a GPU and a CUDA build). The table of c10d::Backend
methods: test_c10d_methods.py."""
import pytest
import torch

import fastpar
from dist_harness import assert_ok, run

DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.cuda)]
                     if fastpar._C.built_with_cuda and torch.cuda.is_available() else [])
pytestmark = pytest.mark.usefixtures("no_leftover_segments")


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("device", DEVICES)
def test_surface(device, world):
    # on cuda every rank uses cuda:0
    assert_ok(run("surface", world, env={"FASTPAR_TEST_DEVICE": device, "FASTPAR_TEST_GPU_LAYOUT": "shared"},
                  timeout=120))


def test_monitored_barrier_names_the_late_rank():
    results = run("monitored_barrier_timeout", 3, timeout=60)
    assert_ok(results)
    assert "[Rank 0]: Rank 2 failed to pass monitoredBarrier in 1000 ms" in results[0].out, results[0].out
