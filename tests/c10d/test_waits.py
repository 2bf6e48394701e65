"""How a CPU group's ranks wait for each other (shm_comm.h, ShmComm::crowded):
a group whose ranks outnumber the CPUs they may run on yields at once while
it waits, any other group spins first; placement() reports which, from the
union of the ranks' CPUs."""
import os

import pytest
import torch
import torch.distributed as dist

import fastpar.distributed as fd
from batched_scenarios import batched, scenario_result, shapes
from dist_harness import assert_ok, scenario
from worker_context import RANK, WORLD, finish, init

pytestmark = pytest.mark.usefixtures("no_leftover_segments")


def _calls_are_right(group):
    """all_reduce of a few sizes and a ring of send/recv on `group`."""
    for n in (1, 5000, 300_000):
        t = torch.full((n,), float(RANK + 1))
        dist.all_reduce(t, group=group)
        assert torch.all(t == WORLD * (WORLD + 1) // 2), (n, t[:4])
    out = torch.full((1000,), float(RANK))
    got = torch.empty(1000)
    works = [dist.isend(out, (RANK + 1) % WORLD, group=group), dist.irecv(got, (RANK - 1) % WORLD, group=group)]
    for w in works:
        w.wait()
    assert torch.all(got == (RANK - 1) % WORLD), got[:4]


@scenario
def sc_waits_follow_the_ranks_cpus():
    """The world group's report matches the union of the ranks' CPUs; a group
    created while every rank is pinned to one CPU is crowded, and its calls
    are right."""
    init()
    p = fd.placement()
    masks = [None] * WORLD
    dist.all_gather_object(masks, sorted(os.sched_getaffinity(0)))
    cpus = set().union(*masks)
    assert p["cpus"] == len(cpus), (p["cpus"], masks)
    assert p["waits"] == ("yield" if len(cpus) < WORLD else "spin"), (p["waits"], masks)
    _calls_are_right(None)
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})  # this thread, which creates the group's segments
    try:
        group = dist.new_group(list(range(WORLD)))
        p = fd.placement(group)
        assert (p["cpus"], p["waits"]) == (1, "yield"), p
        _calls_are_right(group)
    finally:
        os.sched_setaffinity(0, mine)
    dist.barrier()
    finish()


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2, 3], cuda_layouts=[]))
@batched(sc_waits_follow_the_ranks_cpus)
def test_crowded_ranks_yield_at_once(request, device, layout, world):
    assert_ok(scenario_result(request))
