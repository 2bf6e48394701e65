"""fastpar's torch.distributed backend on CUDA tensors ("cpu:fastpar,cuda:fastpar"):
all_reduce over CUDA IPC up to FASTPAR_CUDA_IPC_MAX_BYTES, NCCL above it and
for every other collective; stream semantics; DDP; a killed peer.

Needs >= 2 GPUs and a CUDA build of fastpar (skips otherwise): it has never
run on this repository's CI machines, which have no GPU. What runs without a
GPU: the routing policy (tests/cpp/test_route.cpp), the IPC schedules on the
host (test_cuda_host_emulation.py), the registration for both devices
(test_distributed_devices.py). Scenarios: cuda_backend_worker.py."""
import os

import pytest
import torch

import fastpar
from dist_harness import HERE, assert_ok, run, shm_entries

NGPU = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [
    pytest.mark.skipif(not fastpar._C.built_with_cuda, reason="CPU-only build of fastpar"),
    pytest.mark.skipif(NGPU < 2, reason="needs at least 2 CUDA devices"),
]
WORKER = os.path.join(HERE, "cuda_backend_worker.py")
WORLD = min(NGPU, 4)


def run_cuda(scenario, world=WORLD, env=None, args=(), timeout=600):
    before = shm_entries()
    results = run(scenario, world, env=env, args=args, timeout=timeout, worker=WORKER)
    assert shm_entries() - before == set(), "fastpar segments left in /dev/shm"
    return results


@pytest.mark.parametrize("world", sorted({2, WORLD}))
def test_all_reduce_every_op_and_dtype_below_and_above_the_ipc_threshold(world):
    results = run_cuda("allreduce", world)
    assert_ok(results)
    assert all(f"allreduce rank {r.rank} ok" in r.out for r in results)


def test_all_reduce_with_a_small_slot_crosses_many_chunks():
    # 4 KiB slots: the IPC sizes above 4 KiB run chunked (slot rotation, pipelining).
    results = run_cuda("allreduce", 2, env={"FASTPAR_CUDA_IPC_SLOT_BYTES": "4096"})
    assert_ok(results)


def test_other_collectives_use_the_nccl_fallback():
    assert_ok(run_cuda("fallback_collectives"))


def test_async_op_wait_and_future_then():
    assert_ok(run_cuda("async"))


def test_stock_ddp_matches_nccl():
    assert_ok(run_cuda("ddp"))


@pytest.mark.parametrize("mode", ["blocking", "async"])
def test_sigkilled_peer_makes_the_survivor_raise_within_the_timeout(mode):
    if not (torch.cuda.can_device_access_peer(0, 1) and torch.cuda.can_device_access_peer(1, 0)):
        pytest.skip("GPUs 0 and 1 have no peer access: all_reduce goes to NCCL, whose faults are NCCL's")
    timeout_s = 5
    env = {"FASTPAR_BLOCKING_WAIT": "1"} if mode == "blocking" else {}
    results = run_cuda("sigkill", 2, env=env, args=[mode, timeout_s], timeout=120)
    survivor = results[0]
    assert survivor.rc == 0, survivor.out + survivor.err
    assert results[1].rc == -9, results[1].err  # SIGKILL
    elapsed = float(survivor.out.split("raised after ")[1].split("s:")[0])
    assert elapsed < timeout_s + 10, survivor.out
