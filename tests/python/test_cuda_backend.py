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
Scenarios run batched: one launch of WORLD processes per (layout, world) runs
every selected scenario of that shape in turn (cuda_backend_worker.py,
"batch"), each in its own process group, and each test below checks its own
scenario's report, so a failure is still reported by the test's name. A launch
costs seconds (processes, CUDA contexts, MPS clients): 46 launches did not fit
the GPU check's time, 14 do on one GPU. Scenarios that end their processes (a SIGKILL,
abort(), the p2p mismatch) keep a launch each.

Skips without a GPU (and in CPU-only builds of fastpar): it has never run on
this repository's CI machines. What runs without a GPU: the routing policy
and failure words (ctest), the IPC schedules and the host abort word on the
host (test_cuda_host_emulation.py), the backend's argument errors and knobs
(test_cuda_backend_plumbing.py)."""
import json
import os
import time

import pytest
import torch

import fastpar
from dist_harness import HERE, assert_ok, run, shm_entries
from scenario_batch import section

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
TWO_RANK_LAYOUT = "shared" if NGPU < 2 else "distinct"  # of the 2-rank tests without a layout parameter


# What a new process's first CUDA call says while the MPS server is still
# cleaning up after SIGKILLed clients (docs/gpu.md): it takes clients again
# within seconds.
GPU_BUSY = ("busy or unavailable", "cudaErrorDevicesUnavailable", "MPS server is not ready")


def run_cuda(scenario, world, layout, env=None, args=(), timeout=150):  # a hang must not eat the phase
    before = shm_entries()
    env = dict(env or {}, FASTPAR_TEST_GPU_LAYOUT=layout)
    for attempt in range(4):  # a launch refused by a busy MPS server is retried, 5 s apart
        results = run(scenario, world, env=env, args=args, timeout=timeout, worker=WORKER)
        if not any(r.rc != 0 and any(w in r.err for w in GPU_BUSY) for r in results) or attempt == 3:
            break
        time.sleep(5)
    assert shm_entries() - before == set(), "fastpar segments left in /dev/shm"
    return results


# ---------------------------------------------------------------- batched scenarios

SLOT_4K = {"FASTPAR_CUDA_IPC_SLOT_BYTES": "4096"}
REGISTERED = {"FASTPAR_CUDA_IPC_REGISTERED_BYTES": str(8 << 20), "FASTPAR_CUDA_IPC_SLOT_BYTES": "65536",
              "FASTPAR_TEST_TIMEOUT_S": "30"}
# scenario id -> (worker scenario, args, env). "state" runs first in a batch:
# the one-time MPS warning it looks for is once per process.
SCENARIOS = {
    "state": ("state", [], {}),
    "allreduce": ("allreduce", [], {}),
    "allreduce-slot4096": ("allreduce", [], SLOT_4K),
    "collectives": ("collectives", [], {}),
    "collectives-slot4096": ("collectives", [], SLOT_4K),
    "root_and_alltoall": ("root_and_alltoall", [], {}),
    "p2p": ("p2p", [], {}),
    "p2p_first": ("p2p_first", [], {}),
    "graph": ("graph", [], {"FASTPAR_CUDA_IPC_SLOT_BYTES": "65536"}),
    "registered": ("registered", [], REGISTERED),
    "registered_alone": ("registered_alone", [], REGISTERED),
    "async": ("async", [], {}),
    "ddp-plain": ("ddp", [], {}),
    "ddp-registered": ("ddp", [], {"FASTPAR_CUDA_IPC_REGISTERED_BYTES": str(16 << 20)}),
    "desync-numel": ("desync", ["numel"], {}),
    "desync-root": ("desync", ["root"], {}),
    "desync-op": ("desync", ["op"], {}),
}
PER_SCENARIO_S = 90  # the longest scenario (collectives on 4 ranks) takes well under this
_batches: dict = {}


def _scenario_of(item):
    """(layout, world, scenario id) a collected test checks, or None (a test with a launch of its own)."""
    sid = getattr(getattr(item, "function", None), "scenario", None)
    if sid is None:
        return None
    params = item.callspec.params if hasattr(item, "callspec") else {}
    sid = sid(params) if callable(sid) else sid
    return params.get("layout", TWO_RANK_LAYOUT), params.get("world", 2), sid


def batched(sid):
    """Marks a test as checking scenario `sid` (or sid(params)) of the batch of its (layout, world)."""
    def mark(fn):
        fn.scenario = sid
        return fn
    return mark


def _run_batch(layout, world, sids):
    ordered = sorted(set(sids), key=list(SCENARIOS).index)
    specs = [{"id": s, "name": SCENARIOS[s][0], "args": SCENARIOS[s][1], "env": SCENARIOS[s][2]} for s in ordered]
    return run_cuda("batch", world, layout, args=[json.dumps(specs)], timeout=30 + PER_SCENARIO_S * len(specs))


def scenario_result(request, layout, world, sid):
    """Runs (once per session) the batch of every selected test of this
    (layout, world), then asserts that scenario `sid` passed on every rank."""
    key = (layout, world)
    if key not in _batches:
        sids = [s for s in map(_scenario_of, request.session.items) if s and s[:2] == key]
        _batches[key] = _run_batch(layout, world, [s[2] for s in sids] or [sid])
    results = _batches[key]
    return [section(r, sid) for r in results]


@pytest.mark.parametrize("layout,world", LAYOUTS)
@batched("allreduce")
def test_all_reduce_every_op_and_dtype_below_and_above_the_ipc_threshold(request, layout, world):
    results = scenario_result(request, layout, world, "allreduce")
    assert_ok(results)
    assert all(f"allreduce rank {r.rank} ok" in r.out for r in results)


@pytest.mark.parametrize("layout", ["shared", pytest.param("distinct", marks=needs_two_gpus)])
@batched("allreduce-slot4096")
def test_all_reduce_with_a_small_slot_crosses_many_chunks(request, layout):
    # 4 KiB slots: the IPC sizes above 4 KiB run chunked (slot rotation, pipelining).
    assert_ok(scenario_result(request, layout, 2, "allreduce-slot4096"))


@pytest.mark.parametrize("layout,world", LAYOUTS)
@batched("collectives")
def test_every_ipc_collective_every_dtype_and_op(request, layout, world):
    results = scenario_result(request, layout, world, "collectives")
    assert_ok(results)
    assert all(f"collectives rank {r.rank} ok" in r.out for r in results)


@pytest.mark.parametrize("layout", ["shared", pytest.param("distinct", marks=needs_two_gpus)])
@batched("collectives-slot4096")
def test_collectives_with_a_small_slot(request, layout):
    assert_ok(scenario_result(request, layout, 2, "collectives-slot4096"))


@pytest.mark.parametrize("layout,world", LAYOUTS)
@batched("root_and_alltoall")
def test_gather_scatter_all_to_all_and_what_has_no_ipc_schedule(request, layout, world):
    results = scenario_result(request, layout, world, "root_and_alltoall")
    assert_ok(results)
    assert all(f"root_and_alltoall rank {r.rank} ok" in r.out for r in results)


@pytest.mark.parametrize("layout,world", LAYOUTS)
@batched("p2p")
def test_send_recv_and_batch_isend_irecv_over_ipc(request, layout, world):
    results = scenario_result(request, layout, world, "p2p")
    assert_ok(results)
    assert all(f"p2p rank {r.rank} ok" in r.out for r in results)


@pytest.mark.parametrize("layout,world", LAYOUTS)
@batched("p2p_first")
def test_send_recv_first_with_a_bound_device(request, layout, world):
    results = scenario_result(request, layout, world, "p2p_first")
    assert_ok(results)
    assert all(f"p2p_first rank {r.rank} ok" in r.out for r in results)


@pytest.mark.parametrize("layout,world", LAYOUTS)
@batched("graph")
def test_all_reduce_captured_in_a_cuda_graph(request, layout, world):
    results = scenario_result(request, layout, world, "graph")
    assert_ok(results)
    assert all(f"graph rank {r.rank} ok" in r.out for r in results)


@pytest.mark.parametrize("layout,world", LAYOUTS)
@batched("registered")
def test_registered_cuda_tensors_all_reduce_without_copy_in(request, layout, world):
    results = scenario_result(request, layout, world, "registered")
    assert_ok(results)
    assert all(f"registered rank {r.rank} ok" in r.out for r in results)


@pytest.mark.parametrize("layout,world", LAYOUTS)
@batched("registered_alone")
def test_registered_empty_is_collective_a_rank_alone_fails_at_once(request, layout, world):
    results = scenario_result(request, layout, world, "registered_alone")
    assert_ok(results)
    assert all(f"registered_alone rank {r.rank} ok" in r.out for r in results)


@pytest.mark.parametrize("variant", ["tag", "size"])
def test_a_receive_that_does_not_match_the_next_message_fails(variant):
    results = run_cuda("p2p_mismatch", 2, "shared", env={"FASTPAR_BLOCKING_WAIT": "1"}, args=(variant,))
    assert_ok(results)


@pytest.mark.parametrize("layout", ["shared", pytest.param("distinct", marks=needs_two_gpus)])
@batched("state")
def test_state_and_the_mps_note(request, layout):
    results = scenario_result(request, layout, 2, "state")
    assert_ok(results)
    if layout == "shared":
        line = next(l for l in results[0].out.splitlines() if l.startswith("state: "))
        if "mps=on" not in line:
            # The one-time warning: a Python warning or, where torch does not
            # forward C++ warnings, a line on stderr.
            assert ("mps-warning-python: True" in results[0].out or "time-slice" in results[0].err), (
                results[0].out + results[0].err)


@batched("async")
def test_async_op_wait_and_future_then(request):
    assert_ok(scenario_result(request, TWO_RANK_LAYOUT, 2, "async"))


@pytest.mark.parametrize("layout,world", [p for p in LAYOUTS if p[1] in (2, 3)])
@pytest.mark.parametrize("buckets", ["plain", "registered"])
@batched(lambda p: f"ddp-{p['buckets']}")
def test_stock_and_fastpar_ddp_match_a_reference(request, layout, world, buckets):
    # "registered": fastpar DDP's CUDA buckets live in the IPC arena (bucket_storage.py).
    assert_ok(scenario_result(request, layout, world, f"ddp-{buckets}"))


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
@batched(lambda p: f"desync-{p['variant']}")
def test_desynced_calls_fail_on_every_rank(request, variant):
    assert_ok(scenario_result(request, TWO_RANK_LAYOUT, 2, f"desync-{variant}"))


def test_abort_stops_a_waiting_kernel():
    results = run_cuda("abort", 2, "shared", timeout=120)
    assert all(r.rc == 0 for r in results), [(r.rc, r.out, r.err) for r in results]
    assert "aborted kernel returned after" in results[0].out, results[0].out
