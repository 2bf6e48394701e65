"""The torch.distributed surface beyond the classic collectives (the *_single
and coalesced forms, coalescing blocks, gather into one tensor, mixed
batch_isend_irecv, monitored barrier) on every device fastpar serves (CUDA
where this machine has a GPU and a CUDA build). The table of c10d::Backend
methods: test_c10d_methods.py."""
from __future__ import annotations

import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist

import fastpar
from dist_harness import assert_ok, run, scenario
from worker_context import RANK, TIMEOUT_S, WORLD, finish, init

DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.cuda)]
                     if fastpar._C.built_with_cuda and torch.cuda.is_available() else [])
pytestmark = pytest.mark.usefixtures("no_leftover_segments")


# The device the surface scenarios run on (FASTPAR_TEST_DEVICE: "cpu", or
# "cuda" where ranks share cuda:0).
DEVICE = torch.device(os.environ.get("FASTPAR_TEST_DEVICE", "cpu"))


@scenario
def sc_surface():
    """Every torch.distributed call shape torch 2.11-2.14 programs use beyond
    the classic collectives (the *_single and coalesced forms, coalescing
    blocks, gather into one tensor, mixed batch_isend_irecv, monitored
    barrier), on DEVICE, checked against values every rank can compute."""
    init(backend="fastpar", timeout_s=TIMEOUT_S)
    dev, w, r = DEVICE, WORLD, RANK
    full = lambda v, n=5: torch.full((n,), float(v), device=dev)  # noqa: E731
    # all_gather / reduce_scatter in one tensor, under their 2.14 names where torch has them
    gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    rs_single = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    out = torch.empty(5 * w, device=dev)
    gather_single(out, full(r))
    assert torch.equal(out, torch.cat([full(q) for q in range(w)])), out
    out = torch.empty(5, device=dev)
    rs_single(out, torch.cat([full(r + q) for q in range(w)]))
    assert torch.equal(out, full(sum(q + r for q in range(w)))), out
    # coalescing blocks: torch turns these into all_gather_single_coalesced /
    # reduce_scatter_single_coalesced / allreduce_coalesced on the backend
    outs = [torch.empty(3 * w, device=dev), torch.empty(2 * w, device=dev)]
    with dist._coalescing_manager(device=dev, async_ops=True) as cm:
        gather_single(outs[0], full(r, 3))
        gather_single(outs[1], full(10 * r, 2))
    cm.wait()
    assert torch.equal(outs[0], torch.cat([full(q, 3) for q in range(w)])), outs
    assert torch.equal(outs[1], torch.cat([full(10 * q, 2) for q in range(w)])), outs
    outs = [torch.empty(3, device=dev), torch.empty(2, device=dev)]
    with dist._coalescing_manager(device=dev):  # one reduction for the whole block, as torch requires
        rs_single(outs[0], full(r, 3 * w))
        rs_single(outs[1], full(1, 2 * w))
    assert torch.equal(outs[0], full(sum(range(w)), 3)) and torch.equal(outs[1], full(w, 2)), outs
    ts = [full(r, 4), full(2 * r, 6)]
    with dist._coalescing_manager(device=dev):
        for t in ts:
            dist.all_reduce(t)
    assert torch.equal(ts[0], full(sum(range(w)), 4)) and torch.equal(ts[1], full(2 * sum(range(w)), 6)), ts
    ts = [full(r, 4), full(r, 1)]
    dist.all_reduce_coalesced(ts, op=dist.ReduceOp.MAX)
    assert torch.equal(ts[0], full(w - 1, 4)) and torch.equal(ts[1], full(w - 1, 1)), ts
    lists = [[torch.empty(2, device=dev), torch.empty(3, device=dev)] for _ in range(w)]  # [rank][input]
    dist.all_gather_coalesced(lists, [full(r, 2), full(-r, 3)])
    assert all(torch.equal(lists[q][0], full(q, 2)) and torch.equal(lists[q][1], full(-q, 3)) for q in range(w))
    # gather into one tensor on the root (torch >= 2.14)
    if hasattr(dist, "gather_single"):
        root = w - 1
        out = torch.empty(4 * w, device=dev) if r == root else None
        dist.gather_single(full(r + 1, 4), out, dst=root)
        if r == root:
            assert torch.equal(out, torch.cat([full(q + 1, 4) for q in range(w)])), out
    # mixed point to point in one batch: a ring both ways
    right, left = (r + 1) % w, (r - 1) % w
    got_left, got_right = torch.empty(3, device=dev), torch.empty(3, device=dev)
    ops = [dist.P2POp(dist.isend, full(r, 3), right), dist.P2POp(dist.irecv, got_left, left),
           dist.P2POp(dist.isend, full(-r, 3), left), dist.P2POp(dist.irecv, got_right, right)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert torch.equal(got_left, full(left, 3)) and torch.equal(got_right, full(-right, 3)), (got_left, got_right)
    if dev.type == "cpu":  # sparse COO all_reduce: SUM, as gloo's
        sparse = torch.sparse_coo_tensor(torch.tensor([[r, w + r]]), torch.tensor([1.0 + r, 2.0]), (2 * w,))
        dist.all_reduce(sparse)
        want = torch.cat([torch.arange(1.0, w + 1), torch.full((w,), 2.0)])
        assert torch.equal(sparse.to_dense(), want), sparse
    # every form also as async_op=True
    t = full(r)
    dist.all_reduce(t, async_op=True).wait()
    assert torch.equal(t, full(sum(range(w))))
    monitored_barrier(datetime.timedelta(seconds=TIMEOUT_S), wait_all_ranks=True)
    finish()


def monitored_barrier(timeout: datetime.timedelta, wait_all_ranks: bool) -> None:
    """dist.monitored_barrier; torch before 2.14 refuses it in Python for every
    backend but gloo (by name), so there the group's own method is called:
    the same backend call (docs/c10d_methods.md)."""
    if tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 14):
        dist.monitored_barrier(timeout=timeout, wait_all_ranks=wait_all_ranks)
    else:
        dist.group.WORLD.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("device", DEVICES)
def test_surface(device, world):
    # on cuda every rank uses cuda:0
    assert_ok(run(sc_surface, world, env={"FASTPAR_TEST_DEVICE": device, "FASTPAR_TEST_GPU_LAYOUT": "shared"},
                  timeout=120))


def test_surface_across_fake_hosts():
    """The same surface on 4 ranks over 2 fake hosts (FASTPAR_HOST_ID): the
    hierarchical engine under the front's forms (coalesced, gather into one
    tensor, sparse, mixed point to point) and gloo's monitored barrier over
    every rank."""
    host = lambda r: {"FASTPAR_HOST_ID": "nodeA" if r < 2 else "nodeB"}  # noqa: E731
    assert_ok(run(sc_surface, 4, per_rank_env=host, env={"FASTPAR_TEST_DEVICE": "cpu"}, timeout=180))


@scenario
def sc_monitored_barrier_timeout():
    """A rank that comes late: rank 0 names it, as gloo does."""
    init()
    if RANK == WORLD - 1:
        time.sleep(2.5)
    try:
        monitored_barrier(datetime.timedelta(seconds=1), wait_all_ranks=True)
    except RuntimeError as e:
        print("ERROR:", e, flush=True)
    dist.barrier()
    finish()


def test_monitored_barrier_names_the_late_rank():
    results = run(sc_monitored_barrier_timeout, 3, timeout=60)
    assert_ok(results)
    assert "[Rank 0]: Rank 2 failed to pass monitoredBarrier in 1000 ms" in results[0].out, results[0].out
