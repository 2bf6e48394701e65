"""torch.profiler sees fastpar's calls as gloo's are seen: a range named
"fastpar:<op>" for every collective and point-to-point call, with the input's
shape, lasting until the work is done (a receive's until its data came)."""
from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import fastpar.distributed as fd
from dist_harness import assert_ok, run, scenario
from worker_context import RANK, WORLD, finish, init

pytestmark = pytest.mark.usefixtures("no_leftover_segments")

# Every call a one-rank group can make, and the range it must show.
CALLS = {
    "fastpar:all_reduce": lambda t: dist.all_reduce(t),
    "fastpar:all_reduce_coalesced": lambda t: dist.all_reduce_coalesced([t, t.clone()]),
    "fastpar:broadcast": lambda t: dist.broadcast(t, 0),
    "fastpar:reduce": lambda t: dist.reduce(t, 0),
    "fastpar:all_gather": lambda t: dist.all_gather([torch.empty_like(t)], t),
    "fastpar:all_gather_into_tensor": lambda t: dist.all_gather_into_tensor(torch.empty_like(t), t),
    "fastpar:gather": lambda t: dist.gather(t, [torch.empty_like(t)], dst=0),
    "fastpar:scatter": lambda t: dist.scatter(t, [t.clone()], src=0),
    "fastpar:reduce_scatter": lambda t: dist.reduce_scatter(torch.empty_like(t), [t.clone()]),
    "fastpar:reduce_scatter_tensor": lambda t: dist.reduce_scatter_tensor(torch.empty_like(t), t),
    "fastpar:all_to_all_single": lambda t: dist.all_to_all_single(torch.empty_like(t), t),
    "fastpar:all_to_all": lambda t: dist.all_to_all([torch.empty_like(t)], [t]),
    "fastpar:barrier": lambda t: dist.barrier(),
}


def test_every_collective_has_a_named_range_with_its_shape(one_rank_group):
    t = torch.ones(6, 4)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for call in CALLS.values():
            call(t)
        fd.all_reduce(t)  # the direct call
    events = prof.events()
    names = {e.name for e in events}
    assert set(CALLS) <= names, sorted(set(CALLS) - names)
    ranges = [e for e in events if e.name == "fastpar:all_reduce"]
    assert len(ranges) == 2, [e.name for e in ranges]  # dist.all_reduce and the direct call
    assert all(e.input_shapes and e.input_shapes[0] == [6, 4] for e in ranges), [e.input_shapes for e in ranges]
    assert [e for e in events if e.name == "fastpar:broadcast"][0].input_shapes[0] == [6, 4]


def test_no_range_without_a_profiler(one_rank_group):
    # The ranges cost nothing when nobody records: calls still run and give
    # their results.
    t = torch.full((5,), 2.0)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((5,), 2.0))


DELAY_S = 0.5


@scenario
def sc_recv_range_lasts_until_the_data_comes():
    """Rank 1 posts an irecv that rank 0 answers DELAY_S later: the recv's
    range covers the wait, the isend's too on rank 0 once waited. The barrier
    inside the profile starts the delay only once both profilers record (one
    can take longer than the other to start)."""
    init()
    t = torch.zeros(1000)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        dist.barrier()
        if RANK == 0:
            time.sleep(DELAY_S)
            dist.isend(torch.ones(1000), 1).wait()
        else:
            dist.irecv(t, 0).wait()
    op = "fastpar:send" if RANK == 0 else "fastpar:recv"
    ranges = [e for e in prof.events() if e.name == op]
    assert len(ranges) == 1, [e.name for e in prof.events() if e.name.startswith("fastpar:")]
    took_s = ranges[0].time_range.elapsed_us() / 1e6
    if RANK == 1:
        assert took_s >= DELAY_S * 0.8, f"the recv's range lasted {took_s:.3f} s, less than the wait for its data"
        assert torch.equal(t, torch.ones(1000))
    print(f"rank {RANK} of {WORLD}: {op} {took_s:.3f} s", flush=True)
    finish()


def test_a_pending_call_s_range_ends_when_its_work_completes():
    assert_ok(run(sc_recv_range_lasts_until_the_data_comes, 2))
