"""fastpar's torch.distributed backend on CUDA tensors ("cpu:fastpar,cuda:fastpar"),
multi-process: every collective with a CUDA IPC schedule (all_reduce,
broadcast, reduce, all_gather, all_gather_into_tensor, reduce_scatter,
reduce_scatter_tensor, coalesced forms, gather, scatter, all_to_all_single
with and without split sizes, all_to_all, send/recv/isend/irecv/
batch_isend_irecv) x dtype x op against a reference, all_reduce captured in
CUDA graphs (replays, refusals by name), stream semantics, stock DDP and fastpar.DistributedDataParallel,
faults (a SIGKILLed peer, desynced calls, abort()).

Two GPU layouts (cuda_backend_worker.py, FASTPAR_TEST_GPU_LAYOUT):
  shared    2-4 ranks all on cuda:0: needs one GPU. NCCL cannot run there
            ("Duplicate GPU detected"), so every call is over CUDA IPC or
            refused by name. Start the MPS daemon (nvidia-cuda-mps-control -d)
            first for speed: without it the GPU time-slices between the
            processes and each collective takes milliseconds (still correct).
  distinct  rank r on cuda:r: needs >= 2 GPUs; IPC where every pair has peer
            access, NCCL above FASTPAR_CUDA_IPC_MAX_BYTES (phase-protocol
            collectives only).
Skips without a GPU (and in CPU-only builds of fastpar): it has never run on
this repository's CI machines. What runs without a GPU: the routing policy
and failure words (ctest), the IPC schedules and the host abort word on the
host (test_cuda_host_emulation.py), the backend's argument errors and knobs
(test_cuda_backend_plumbing.py)."""
import os

import pytest
import torch

import fastpar
from dist_harness import HERE, assert_ok, run, shm_entries

NGPU = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [
    pytest.mark.skipif(not fastpar._C.built_with_cuda, reason="CPU-only build of fastpar"),
    pytest.mark.skipif(NGPU < 1, reason="needs a CUDA device"),
]
WORKER = os.path.join(HERE, "cuda_backend_worker.py")

# (layout, world) pairs this machine can run.
LAYOUTS = [("shared", 2), ("shared", 3), ("shared", 4)]
if NGPU >= 2:
    LAYOUTS += sorted({("distinct", 2), ("distinct", min(NGPU, 4))})
needs_two_gpus = pytest.mark.skipif(NGPU < 2, reason="the distinct-GPU layout needs at least 2 CUDA devices")


def run_cuda(scenario, world, layout, env=None, args=(), timeout=150):  # a hang must not eat the phase
    before = shm_entries()
    env = dict(env or {}, FASTPAR_TEST_GPU_LAYOUT=layout)
    results = run(scenario, world, env=env, args=args, timeout=timeout, worker=WORKER)
    assert shm_entries() - before == set(), "fastpar segments left in /dev/shm"
    return results


@pytest.mark.parametrize("layout,world", LAYOUTS)
def test_all_reduce_every_op_and_dtype_below_and_above_the_ipc_threshold(layout, world):
    results = run_cuda("allreduce", world, layout)
    assert_ok(results)
    assert all(f"allreduce rank {r.rank} ok" in r.out for r in results)


@pytest.mark.parametrize("layout", ["shared", pytest.param("distinct", marks=needs_two_gpus)])
def test_all_reduce_with_a_small_slot_crosses_many_chunks(layout):
    # 4 KiB slots: the IPC sizes above 4 KiB run chunked (slot rotation, pipelining).
    results = run_cuda("allreduce", 2, layout, env={"FASTPAR_CUDA_IPC_SLOT_BYTES": "4096"})
    assert_ok(results)


@pytest.mark.parametrize("layout,world", LAYOUTS)
def test_every_ipc_collective_every_dtype_and_op(layout, world):
    results = run_cuda("collectives", world, layout)
    assert_ok(results)
    assert all(f"collectives rank {r.rank} ok" in r.out for r in results)


@pytest.mark.parametrize("layout", ["shared", pytest.param("distinct", marks=needs_two_gpus)])
def test_collectives_with_a_small_slot(layout):
    assert_ok(run_cuda("collectives", 2, layout, env={"FASTPAR_CUDA_IPC_SLOT_BYTES": "4096"}))


@pytest.mark.parametrize("layout,world", LAYOUTS)
def test_gather_scatter_all_to_all_and_what_has_no_ipc_schedule(layout, world):
    results = run_cuda("root_and_alltoall", world, layout)
    assert_ok(results)
    assert all(f"root_and_alltoall rank {r.rank} ok" in r.out for r in results)


@pytest.mark.parametrize("layout,world", LAYOUTS)
def test_send_recv_and_batch_isend_irecv_over_ipc(layout, world):
    results = run_cuda("p2p", world, layout)
    assert_ok(results)
    assert all(f"p2p rank {r.rank} ok" in r.out for r in results)


@pytest.mark.parametrize("layout,world", LAYOUTS)
def test_send_recv_first_with_a_bound_device(layout, world):
    results = run_cuda("p2p_first", world, layout)
    assert_ok(results)
    assert all(f"p2p_first rank {r.rank} ok" in r.out for r in results)


@pytest.mark.parametrize("layout,world", LAYOUTS)
def test_all_reduce_captured_in_a_cuda_graph(layout, world):
    results = run_cuda("graph", world, layout, env={"FASTPAR_CUDA_IPC_SLOT_BYTES": "65536"})
    assert_ok(results)
    assert all(f"graph rank {r.rank} ok" in r.out for r in results)


@pytest.mark.parametrize("layout,world", LAYOUTS)
def test_registered_cuda_tensors_all_reduce_without_copy_in(layout, world):
    env = {"FASTPAR_CUDA_IPC_REGISTERED_BYTES": str(8 << 20), "FASTPAR_CUDA_IPC_SLOT_BYTES": "65536",
           "FASTPAR_TEST_TIMEOUT_S": "30"}
    results = run_cuda("registered", world, layout, env=env)
    assert_ok(results)
    assert all(f"registered rank {r.rank} ok" in r.out for r in results)


@pytest.mark.parametrize("variant", ["tag", "size"])
def test_a_receive_that_does_not_match_the_next_message_fails(variant):
    results = run_cuda("p2p_mismatch", 2, "shared", env={"FASTPAR_BLOCKING_WAIT": "1"}, args=(variant,))
    assert_ok(results)


@pytest.mark.parametrize("layout", ["shared", pytest.param("distinct", marks=needs_two_gpus)])
def test_state_and_the_mps_note(layout):
    results = run_cuda("state", 2, layout)
    assert_ok(results)
    if layout == "shared":
        line = next(l for l in results[0].out.splitlines() if l.startswith("state: "))
        if "mps=on" not in line:
            # The one-time warning: a Python warning or, where torch does not
            # forward C++ warnings, a line on stderr.
            assert ("mps-warning-python: True" in results[0].out or "time-slice" in results[0].err), (
                results[0].out + results[0].err)


def test_async_op_wait_and_future_then():
    assert_ok(run_cuda("async", 2, "shared" if NGPU < 2 else "distinct"))


@pytest.mark.parametrize("layout,world", [p for p in LAYOUTS if p[1] in (2, 3)])
@pytest.mark.parametrize("buckets", ["plain", "registered"])
def test_stock_and_fastpar_ddp_match_a_reference(layout, world, buckets):
    # "registered": fastpar DDP's CUDA buckets live in the IPC arena (bucket_storage.py).
    env = {"FASTPAR_CUDA_IPC_REGISTERED_BYTES": str(16 << 20)} if buckets == "registered" else {}
    assert_ok(run_cuda("ddp", world, layout, env=env))


@pytest.mark.parametrize("layout,world", [("shared", 2), ("shared", 3)] +
                         ([("distinct", 2)] if NGPU >= 2 else []))
@pytest.mark.parametrize("mode", ["blocking", "async"])
@pytest.mark.parametrize("op", ["all_reduce", "broadcast"])
def test_sigkilled_peer_makes_every_survivor_raise_within_seconds(layout, world, mode, op):
    if layout == "distinct" and not (torch.cuda.can_device_access_peer(0, 1) and
                                     torch.cuda.can_device_access_peer(1, 0)):
        pytest.skip("GPUs 0 and 1 have no peer access: the calls go to NCCL, whose faults are NCCL's")
    env = {"FASTPAR_BLOCKING_WAIT": "1"} if mode == "blocking" else {}
    results = run_cuda("sigkill", world, layout, env=env, args=[mode, op], timeout=120)
    for survivor in results[:-1]:
        assert survivor.rc == 0, survivor.out + survivor.err
        assert "raised after" in survivor.out, survivor.out
    assert results[-1].rc == -9, results[-1].err  # SIGKILL


@pytest.mark.parametrize("variant", ["numel", "root", "op"])
def test_desynced_calls_fail_on_every_rank(variant):
    layout = "shared" if NGPU < 2 else "distinct"
    results = run_cuda("desync", 2, layout, args=[variant], timeout=120)
    assert_ok(results)


def test_abort_stops_a_waiting_kernel():
    results = run_cuda("abort", 2, "shared", timeout=120)
    assert all(r.rc == 0 for r in results), [(r.rc, r.out, r.err) for r in results]
    assert "aborted kernel returned after" in results[0].out, results[0].out
