"""Stock DistributedDataParallel on fastpar matches a reference, on each
device: on the CPU, single-process training on the whole batch (2 ranks);
on CUDA tensors, stock DDP and fastpar.DistributedDataParallel against DDP on
a reference group, with fastpar DDP's buckets plain or in the IPC arena
("registered", bucket_storage.py). The CUDA shapes are batched with the
other CUDA scenarios (batched_scenarios.py) and skip without a GPU."""
import pytest

from batched_scenarios import CUDA_LAYOUTS, batched, cpu_shape, cuda_shape, scenario_result
from dist_harness import assert_ok, run

pytestmark = pytest.mark.usefixtures("no_leftover_segments")
SHAPES = [pytest.param(*cpu_shape(2).values, "plain", id="cpu-2")] + [
    pytest.param(*s.values, buckets, id=f"{s.id}-{buckets}", marks=s.marks)
    for buckets in ("plain", "registered") for s in (cuda_shape(l, w) for l, w in CUDA_LAYOUTS if w in (2, 3))]


@pytest.mark.parametrize("device,layout,world,buckets", SHAPES)
@batched(lambda p: f"ddp-{p['buckets']}" if p["device"] == "cuda" else None)
def test_stock_ddp_matches_a_reference(request, device, layout, world, buckets):
    if device == "cuda":
        assert_ok(scenario_result(request, device, layout, world, f"ddp-{buckets}"))
    else:
        assert_ok(run("ddp", world))
