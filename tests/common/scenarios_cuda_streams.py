"""CUDA-only scenarios (dist_worker.py runs them with FASTPAR_TEST_DEVICE=cuda):
what has no CPU counterpart: the IPC state and the MPS note, async work
and stream order, all_reduce captured in CUDA graphs."""
from __future__ import annotations

import torch
import torch.distributed as dist

from reference import in_rank_order, random_data
from worker_context import DEV, RANK, SHARED, WORLD, check_equal, cuda_backend, init, peer_access_everywhere


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
