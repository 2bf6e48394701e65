"""What only fastpar's CUDA path has, multi-process ("cpu:fastpar,cuda:fastpar"):
small IPC slots that make every size cross many chunks, gather / scatter /
all_to_all over IPC and the calls with no IPC schedule, send/recv as the
first calls of a group bound to a device, all_reduce captured in CUDA
graphs (replays, refusals by name), stream semantics of async work, the IPC
state and the MPS note, the schedule knobs in force after setup. The
collectives both devices have: test_collectives.py; send/recv: test_p2p.py;
the IPC faults: faults/test_cuda_ipc_faults.py.

Skips without a GPU (and in CPU-only builds of fastpar). What runs without a
GPU: the routing policy and failure words (ctest), the IPC schedules and the
host abort word on the host (tooling/test_cuda_host_emulation.py), the
backend's argument errors and knobs (test_cuda_backend_plumbing.py)."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import fastpar.distributed as fd
from batched_scenarios import (CUDA_LAYOUTS, CUDA_MARKS, SLOT_4K, InBatch, assert_scenario_ok, batched, needs_two_gpus,
                               scenario_result)
from dist_harness import assert_ok, scenario
from reference import DTYPES, exact_data, in_rank_order, random_data
from test_collectives import sc_allreduce, sc_collectives
from worker_context import DEV, RANK, SHARED, WORLD, check_equal, cuda_backend, init, peer_access_everywhere

pytestmark = CUDA_MARKS


@pytest.mark.parametrize("layout", ["shared", pytest.param("distinct", marks=needs_two_gpus)])
@batched(InBatch(sc_allreduce, env=SLOT_4K, id="allreduce-slot4096"))
def test_all_reduce_with_a_small_slot_crosses_many_chunks(request, layout):
    # 4 KiB slots: the IPC sizes above 4 KiB run chunked (slot rotation, pipelining).
    assert_ok(scenario_result(request))


@pytest.mark.parametrize("layout", ["shared", pytest.param("distinct", marks=needs_two_gpus)])
@batched(InBatch(sc_collectives, env=SLOT_4K, id="collectives-slot4096"))
def test_collectives_with_a_small_slot(request, layout):
    assert_ok(scenario_result(request))


@scenario
def sc_root_and_alltoall():
    """gather and scatter (every root), all_to_all_single (even splits) and
    all_to_all (equal tensors) over CUDA IPC, every dtype, against the
    reference; uneven all_to_all_single / all_to_all: the per-pair p2p rings
    over CUDA IPC whatever the sizes (NCCL where IPC is off), also when
    some ranks' splits happen to be equal and others' not."""
    init()
    cb = cuda_backend()
    ipc = peer_access_everywhere()
    seed = 500
    for dtype in DTYPES:
        for n in (0, 1, 17, 1000, 100_003):
            seed += 1
            xs = [exact_data(q, n, dtype, seed) for q in range(WORLD)]
            for root in range(WORLD):
                gl = [torch.full((n,), 3, dtype=dtype, device=DEV) for _ in range(WORLD)] if RANK == root else None
                dist.gather(xs[RANK].to(DEV), gl, dst=root)
                if RANK == root:
                    for q in range(WORLD):
                        check_equal(gl[q], xs[q], f"gather {dtype} n={n} root={root} [{q}]", True)
                blocks = [exact_data(q + 10 * root, n, dtype, seed) for q in range(WORLD)]
                o = torch.full((n,), 3, dtype=dtype, device=DEV)
                dist.scatter(o, [b.to(DEV) for b in blocks] if RANK == root else None, src=root)
                check_equal(o, blocks[RANK], f"scatter {dtype} n={n} root={root}", True)
            # all_to_all_single: rank q's input is WORLD blocks; block r goes to rank r.
            ins = [exact_data(q, WORLD * n, dtype, seed + 7) for q in range(WORLD)]
            o = torch.empty(WORLD * n, dtype=dtype, device=DEV)
            dist.all_to_all_single(o, ins[RANK].to(DEV))
            want = torch.cat([ins[q][RANK * n:(RANK + 1) * n] for q in range(WORLD)])
            check_equal(o, want, f"all_to_all_single {dtype} n={n}", True)
            outs = [torch.empty(n, dtype=dtype, device=DEV) for _ in range(WORLD)]
            dist.all_to_all(outs, [c.to(DEV) for c in ins[RANK].chunk(WORLD)] if n else
                            [torch.empty(0, dtype=dtype, device=DEV) for _ in range(WORLD)])
            for q in range(WORLD):
                check_equal(outs[q], ins[q][RANK * n:(RANK + 1) * n], f"all_to_all {dtype} n={n} [{q}]", True)
    if ipc:
        assert cb.fallback_calls == 0, cb.fallback_calls
    # Uneven splits: rank r sends r+1 rows to everyone, and all_to_all with
    # tensors of different sizes; then splits that are equal on rank 0 only
    # (rank r sends 2 rows to rank 0 and 2+q to rank q > 0; rank 0 sends 2 to
    # everyone): every rank must still take the same route.
    calls0 = cb.ipc_calls
    inp = torch.full(((RANK + 1) * WORLD,), float(RANK), device=DEV)
    out_splits = [q + 1 for q in range(WORLD)]
    o = torch.empty(sum(out_splits), device=DEV)
    dist.all_to_all_single(o, inp, out_splits, [RANK + 1] * WORLD)
    want = torch.cat([torch.full((q + 1,), float(q)) for q in range(WORLD)])  # rank q sends q+1 to each
    check_equal(o, want, "uneven all_to_all_single", True)
    outs = [torch.empty(q * 1000 + 3, device=DEV) for q in range(WORLD)]
    dist.all_to_all(outs, [torch.full((RANK * 1000 + 3,), float(RANK * 10 + q), device=DEV) for q in range(WORLD)])
    for q in range(WORLD):
        check_equal(outs[q], torch.full((q * 1000 + 3,), float(q * 10 + RANK)), f"uneven all_to_all [{q}]", True)
    rows = lambda r, q: 2 if r == 0 or q == 0 else 2 + q  # noqa: E731  (rows rank r sends to rank q)
    in_splits, out_splits = [rows(RANK, q) for q in range(WORLD)], [rows(q, RANK) for q in range(WORLD)]
    o = torch.empty(sum(out_splits), device=DEV)
    dist.all_to_all_single(o, torch.full((sum(in_splits),), float(RANK), device=DEV), out_splits, in_splits)
    want = torch.cat([torch.full((out_splits[q],), float(q)) for q in range(WORLD)])
    check_equal(o, want, "all_to_all_single, splits equal on rank 0 only", True)
    if ipc:
        assert cb.ipc_calls == calls0 + 3, (cb.ipc_calls, calls0)
        # The CUDA engine's own barrier (what a barrier naming the device
        # reaches, as a "cpu:gloo,cuda:fastpar" group's does): one IPC phase,
        # and wait() returns once every rank arrived.
        fb = cb.fallback_calls
        opts = dist.BarrierOptions()
        opts.device_ids = [torch.device(DEV).index]
        for _ in range(3):
            fd.get_fastpar_backend(device_type="cuda").barrier(opts).wait()
        assert cb.ipc_calls == calls0 + 6 and cb.fallback_calls == fb, (cb.ipc_calls, cb.fallback_calls)
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()
    print(f"root_and_alltoall rank {RANK} ok", flush=True)


@pytest.mark.parametrize("layout,world", CUDA_LAYOUTS)
@batched(sc_root_and_alltoall)
def test_gather_scatter_all_to_all_and_what_has_no_ipc_schedule(request, layout, world):
    assert_scenario_ok(scenario_result(request), "cuda", "root_and_alltoall")


@scenario
def sc_graph():
    """dist.all_reduce captured in CUDA graphs (over CUDA IPC where the group
    has it): every replay, on new inputs, gives the in-order result; two
    graphs of different sizes and eager calls interleave; what cannot be
    captured over IPC is refused by name (run with a 64 KiB slot:
    an all_reduce larger than a slot, a broadcast)."""
    init()
    dist.all_reduce(torch.ones(1, device=DEV))  # sets IPC up: setup cannot happen inside a capture
    ipc = peer_access_everywhere()
    SUM, MAX = dist.ReduceOp.SUM, dist.ReduceOp.MAX
    x = torch.zeros(1000, device=DEV)
    y = torch.zeros(3, dtype=torch.bfloat16, device=DEV)
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(g1):
        dist.all_reduce(x)
    with torch.cuda.graph(g2):
        dist.all_reduce(y, op=MAX)
    for i in range(6):
        xs = [random_data(q, 1000, torch.float32, 700 + i) for q in range(WORLD)]
        x.copy_(xs[RANK].to(DEV))
        g1.replay()
        check_equal(x, in_rank_order(xs, SUM, torch.float32), f"graph replay {i}", ipc)
        ys = [random_data(q, 3, torch.bfloat16, 800 + i) for q in range(WORLD)]
        y.copy_(ys[RANK].to(DEV))
        g2.replay()
        check_equal(y, in_rank_order(ys, MAX, torch.bfloat16), f"graph replay {i} (bf16 MAX)", True)
        e = torch.full((17,), float(RANK), device=DEV)
        dist.all_reduce(e)  # eager, between replays
        check_equal(e, torch.full((17,), float(sum(range(WORLD)))), f"eager call after replay {i}", True)
    # A Work made inside the capture: waited on there (the capturing stream
    # waits on a captured event), then asked about after the capture, where
    # querying or waiting on that event would be a CUDA error.
    g3 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g3):
        work = dist.all_reduce(x, async_op=True)
        work.wait()
    assert work.is_completed()
    work.wait()
    xs = [random_data(q, 1000, torch.float32, 900) for q in range(WORLD)]
    x.copy_(xs[RANK].to(DEV))
    g3.replay()
    check_equal(x, in_rank_order(xs, SUM, torch.float32), "replay of a graph holding an async all_reduce", ipc)
    if ipc:
        big = torch.zeros(65536 // 4 + 1, device=DEV)
        for what, call, words in [
            ("all_reduce larger than a slot", lambda: dist.all_reduce(big),
             "a CUDA graph can capture an all_reduce over CUDA IPC of at most FASTPAR_CUDA_IPC_SLOT_BYTES"),
            ("broadcast", lambda: dist.broadcast(x, src=0), "fastpar.broadcast: cannot be captured in a CUDA graph"),
        ]:
            try:
                with torch.cuda.graph(torch.cuda.CUDAGraph()):
                    call()
                raise AssertionError(f"{what} inside a capture did not raise")
            except ValueError as err:
                assert words in str(err), str(err)
        # The refusals happened before any rank waited: the group still works.
        e = torch.ones(5, device=DEV)
        dist.all_reduce(e)
        check_equal(e, torch.full((5,), float(WORLD)), "eager call after the refusals", True)
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()
    print(f"graph rank {RANK} ok", flush=True)


@pytest.mark.parametrize("layout,world", CUDA_LAYOUTS)
@batched(InBatch(sc_graph, env={"FASTPAR_CUDA_IPC_SLOT_BYTES": "65536"}))
def test_all_reduce_captured_in_a_cuda_graph(request, layout, world):
    assert_scenario_ok(scenario_result(request), "cuda", "graph")


@scenario
def sc_state():
    """ipc_state, shares_gpu and mps after setup; the one-time warning when
    ranks share a GPU without MPS."""
    import warnings
    init()
    cb = cuda_backend()
    assert cb.ipc_state == "not set up" and cb.mps == "" and cb.dead_peer == -1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = torch.ones(4, device=DEV)
        dist.all_reduce(t)
    assert cb.mps in ("on", "off", "unknown"), cb.mps
    assert cb.shares_gpu == SHARED, (cb.shares_gpu, SHARED)
    if peer_access_everywhere():
        assert cb.ipc_state.startswith(f"ipc on cuda:{DEV.index}"), cb.ipc_state
    if SHARED:
        assert "share a GPU" in cb.ipc_state, cb.ipc_state
        texts = [str(w.message) for w in caught]
        if cb.mps != "on":
            # TORCH_WARN_ONCE reaches Python as a UserWarning where torch
            # forwards C++ warnings; else it went to stderr (checked by the test).
            print("mps-warning-python:", any("time-slice" in x for x in texts), flush=True)
        print(f"state: {cb.ipc_state} mps={cb.mps}", flush=True)
    dist.destroy_process_group()
    print(f"state rank {RANK} ok", flush=True)


@pytest.mark.parametrize("layout", ["shared", pytest.param("distinct", marks=needs_two_gpus)])
@batched(InBatch(sc_state, order=-1))
def test_state_and_the_mps_note(request, layout):
    results = scenario_result(request)
    assert_ok(results)
    if layout == "shared":
        line = next(l for l in results[0].out.splitlines() if l.startswith("state: "))
        if "mps=on" not in line:
            # The one-time warning: a Python warning or, where torch does not
            # forward C++ warnings, a line on stderr.
            assert ("mps-warning-python: True" in results[0].out or "time-slice" in results[0].err), (
                results[0].out + results[0].err)


@scenario
def sc_knobs():
    """The schedule knobs the batch's env names are in force after the IPC
    setup (the two-shot form, the one-shot limit) and the others keep their
    defaults; the results keep their bits."""
    init()
    cb = cuda_backend()
    for n in (1000, 100_000):  # one-shot, then two-shot above the knob's 8 KiB limit
        t = torch.full((n,), float(RANK + 1), device=DEV)
        dist.all_reduce(t)
        assert torch.equal(t, torch.full_like(t, WORLD * (WORLD + 1) / 2)), (n, t[:4])
    assert cb.ipc_two_shot == "fused", cb.ipc_two_shot
    assert cb.ipc_collectives == "steps"  # the default
    assert cb.one_shot_max_bytes == 8192, cb.one_shot_max_bytes
    dist.destroy_process_group()
    print(f"knobs rank {RANK} ok", flush=True)


@pytest.mark.parametrize("layout", ["shared", pytest.param("distinct", marks=needs_two_gpus)])
@batched(InBatch(sc_knobs, env={"FASTPAR_CUDA_IPC_TWO_SHOT": "fused", "FASTPAR_CUDA_IPC_ONE_SHOT_MAX_BYTES": "8192",
                                "FASTPAR_CUDA_IPC_COLLECTIVES": ""}))
def test_schedule_knobs_apply_at_setup(request, layout):
    assert_ok(scenario_result(request))


@scenario
def sc_async():
    """async_op: wait() orders the caller's stream; get_future().then() runs
    after the kernels (a CUDA-aware future, as DDP comm hooks need)."""
    init()
    xs = [random_data(q, 50_000, torch.float32, 7) for q in range(WORLD)]
    want = in_rank_order(xs, dist.ReduceOp.SUM, torch.float32)
    t = xs[RANK].to(DEV)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future().then(lambda f: f.value()[0] * 2)
    doubled = fut.wait()
    assert torch.equal(doubled.cpu(), want * 2)
    assert work.wait() is True
    torch.cuda.synchronize()
    assert work.is_completed()
    assert torch.equal(t.cpu(), want)
    # Enqueued on a side stream; the default stream waits through wait().
    s = torch.cuda.Stream()
    t2 = xs[RANK].to(DEV)
    torch.cuda.current_stream().synchronize()
    with torch.cuda.stream(s):
        torch.cuda._sleep(20_000_000)  # keep the side stream busy: an unordered read would see the input
        work = dist.all_reduce(t2, async_op=True)
    work.wait()  # the current (default) stream now waits for the side stream's kernels
    assert torch.equal((t2 + 0).cpu(), want)
    # Calls on two streams, neither told to wait for the other (as FSDP's
    # all-gather and reduce-scatter streams): the backend runs them in the
    # order they were enqueued. With the first stream kept busy, the second
    # call would otherwise run first and the ranks' phase numbers would cross.
    xs3 = [x * 3 for x in xs]
    want3 = in_rank_order(xs3, dist.ReduceOp.SUM, torch.float32)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    a, b = xs[RANK].to(DEV), xs3[RANK].to(DEV)
    torch.cuda.synchronize()
    for i in range(3):
        with torch.cuda.stream(s1):
            torch.cuda._sleep(20_000_000)
            dist.all_reduce(a if i == 0 else a.zero_())
        with torch.cuda.stream(s2):
            dist.all_reduce(b if i == 0 else b.zero_())
    torch.cuda.synchronize()
    assert torch.equal(a.cpu(), torch.zeros_like(want)) and torch.equal(b.cpu(), torch.zeros_like(want3))
    a, b = xs[RANK].to(DEV), xs3[RANK].to(DEV)
    torch.cuda.synchronize()
    with torch.cuda.stream(s1):
        torch.cuda._sleep(20_000_000)
        dist.all_reduce(a)
    with torch.cuda.stream(s2):
        dist.all_reduce(b)
    torch.cuda.synchronize()
    assert torch.equal(a.cpu(), want) and torch.equal(b.cpu(), want3)
    dist.destroy_process_group()
    print(f"async rank {RANK} ok", flush=True)


@batched(sc_async)
def test_async_op_wait_and_future_then(request):
    assert_ok(scenario_result(request))


@scenario
def sc_direct():
    """fastpar.distributed.all_reduce on CUDA tensors: no Work, no event (the
    kernels are on the caller's stream already), the same bits as
    dist.all_reduce at one-shot and two-shot sizes, on a side stream too,
    captured in a CUDA graph, and the fallback's calls still answered."""
    init()
    cb = cuda_backend()
    for dtype in DTYPES:
        for n in (1, 1000, 300_001):  # 300_001 elements: past the one-shot sizes
            xs = [random_data(q, n, dtype, 11) for q in range(WORLD)]
            a, b = xs[RANK].to(DEV), xs[RANK].to(DEV)
            dist.all_reduce(a)
            calls, direct = cb.ipc_calls, cb.direct_calls
            fd.all_reduce(b)
            if cb.ipc_state.startswith("ipc"):
                assert (cb.ipc_calls, cb.direct_calls) == (calls + 1, direct + 1), (calls, direct, cb.ipc_calls,
                                                                                   cb.direct_calls)
            assert torch.equal(a.cpu(), b.cpu()), f"direct all_reduce {dtype} n={n}: not dist.all_reduce's bits"
    # On a side stream that is kept busy: the result is there once that stream is.
    xs = [random_data(q, 50_000, torch.float32, 12) for q in range(WORLD)]
    want = in_rank_order(xs, dist.ReduceOp.SUM, torch.float32)
    s = torch.cuda.Stream()
    t = xs[RANK].to(DEV)
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        torch.cuda._sleep(20_000_000)
        fd.all_reduce(t)
    s.synchronize()
    assert torch.equal(t.cpu(), want)
    # Captured in a CUDA graph and replayed.
    if cb.ipc_state.startswith("ipc"):
        g, x = torch.cuda.CUDAGraph(), torch.zeros(1024, device=DEV)
        with torch.cuda.graph(g):
            fd.all_reduce(x)
        for i in range(3):
            x.fill_(float(RANK + i))
            g.replay()
            torch.cuda.synchronize()
            assert torch.all(x == sum(q + i for q in range(WORLD))), (i, x[:4])
    dist.destroy_process_group()
    print(f"direct rank {RANK} ok", flush=True)


@batched(sc_direct)
def test_direct_all_reduce_has_no_work_and_dist_bits(request):
    assert_ok(scenario_result(request))
