"""What only fastpar's CUDA path has, multi-process ("cpu:fastpar,cuda:fastpar"):
small IPC slots that make every size cross many chunks, gather / scatter /
all_to_all over IPC and the calls with no IPC schedule, send/recv as the
first calls of a group bound to a device, all_reduce captured in CUDA
graphs (replays, refusals by name), stream semantics of async work, the IPC
state and the MPS note. The collectives both devices have:
test_collectives.py; send/recv: test_p2p.py; the IPC faults:
faults/test_cuda_ipc_faults.py.

Skips without a GPU (and in CPU-only builds of fastpar). What runs without a
GPU: the routing policy and failure words (ctest), the IPC schedules and the
host abort word on the host (tooling/test_cuda_host_emulation.py), the
backend's argument errors and knobs (test_cuda_backend_plumbing.py)."""
import pytest

from batched_scenarios import (CUDA_LAYOUTS, CUDA_MARKS, TWO_RANK_LAYOUT, assert_scenario_ok, batched, needs_two_gpus,
                               scenario_result)
from dist_harness import assert_ok

pytestmark = CUDA_MARKS


@pytest.mark.parametrize("layout", ["shared", pytest.param("distinct", marks=needs_two_gpus)])
@batched("allreduce-slot4096")
def test_all_reduce_with_a_small_slot_crosses_many_chunks(request, layout):
    # 4 KiB slots: the IPC sizes above 4 KiB run chunked (slot rotation, pipelining).
    assert_ok(scenario_result(request, "cuda", layout, 2, "allreduce-slot4096"))


@pytest.mark.parametrize("layout", ["shared", pytest.param("distinct", marks=needs_two_gpus)])
@batched("collectives-slot4096")
def test_collectives_with_a_small_slot(request, layout):
    assert_ok(scenario_result(request, "cuda", layout, 2, "collectives-slot4096"))


@pytest.mark.parametrize("layout,world", CUDA_LAYOUTS)
@batched("root_and_alltoall")
def test_gather_scatter_all_to_all_and_what_has_no_ipc_schedule(request, layout, world):
    assert_scenario_ok(scenario_result(request, "cuda", layout, world, "root_and_alltoall"), "cuda",
                       "root_and_alltoall")


@pytest.mark.parametrize("layout,world", CUDA_LAYOUTS)
@batched("graph")
def test_all_reduce_captured_in_a_cuda_graph(request, layout, world):
    assert_scenario_ok(scenario_result(request, "cuda", layout, world, "graph"), "cuda", "graph")


@pytest.mark.parametrize("layout", ["shared", pytest.param("distinct", marks=needs_two_gpus)])
@batched("state")
def test_state_and_the_mps_note(request, layout):
    results = scenario_result(request, "cuda", layout, 2, "state")
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
    assert_ok(scenario_result(request, "cuda", TWO_RANK_LAYOUT, 2, "async"))
