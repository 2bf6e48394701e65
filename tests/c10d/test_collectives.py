"""Every collective of fastpar's torch.distributed backend against a
reference, in real processes, on each device and world size: on the CPU over
shared memory (a 4 KiB slot makes the larger sizes cross many chunks; both
allreduce schedules run, auto and each one forced); on CUDA tensors
("cpu:fastpar,cuda:fastpar") over CUDA IPC, every op x dtype below
(bitwise, in rank order) and above the IPC threshold, the route each call
took. The CUDA shapes skip without a GPU (and in CPU-only builds).
Batched: one launch per shape (batched_scenarios.py). What only the CUDA
path has (small IPC slots, graphs, streams, the IPC state): test_cuda_ipc.py."""
import pytest

from batched_scenarios import assert_scenario_ok, batched, scenario_result, shapes
from dist_harness import assert_ok

pytestmark = pytest.mark.usefixtures("no_leftover_segments")


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2, 3, 4]))
@batched("allreduce")
def test_all_reduce_every_op_dtype_and_size(request, device, layout, world):
    assert_scenario_ok(scenario_result(request, device, layout, world, "allreduce"), device, "allreduce")


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2], cuda_layouts=[]))
@pytest.mark.parametrize("schedule", ["one_shot", "two_shot"])
@batched(lambda p: f"allreduce-{p['schedule']}")
def test_all_reduce_with_each_schedule_forced(request, device, layout, world, schedule):
    assert_ok(scenario_result(request, device, layout, world, f"allreduce-{schedule}"))


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2, 3]))
@batched("collectives")
def test_every_collective_every_dtype_and_op(request, device, layout, world):
    assert_scenario_ok(scenario_result(request, device, layout, world, "collectives"), device, "collectives")


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2, 3, 4]))
@batched("registered")
def test_registered_buffers_all_reduce_without_copy_in(request, device, layout, world):
    assert_scenario_ok(scenario_result(request, device, layout, world, "registered"), device, "registered")


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2, 3], cuda_layouts=[]))
@batched("avg_integers")
def test_avg_of_integers_as_nccl_computes_it(request, device, layout, world):
    assert_ok(scenario_result(request, device, layout, world, "avg_integers"))


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2, 3], cuda_layouts=[]))
@batched("bitwise_bool_complex")
def test_bitwise_ops_bool_and_complex_tensors_as_gloo_reduces_them(request, device, layout, world):
    assert_ok(scenario_result(request, device, layout, world, "bitwise_bool_complex"))


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2, 3], cuda_layouts=[]))
@batched("strided")
def test_cpu_tensors_with_any_strides_as_gloo_takes_them(request, device, layout, world):
    assert_ok(scenario_result(request, device, layout, world, "strided"))


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2], cuda_layouts=[]))
@batched("bad_input")
def test_bad_input_is_refused_before_any_work(request, device, layout, world):
    results = scenario_result(request, device, layout, world, "bad_input")
    assert_ok(results)
    assert "fastpar.send: tensors[0] must be contiguous" in results[0].out, results[0].out
