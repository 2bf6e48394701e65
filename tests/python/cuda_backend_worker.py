"""Scenarios of test_cuda_backend.py, one process per rank:

    python cuda_backend_worker.py SCENARIO RANK WORLD PORT [ARGS...]
    python cuda_backend_worker.py batch RANK WORLD PORT SPECS_JSON

A batch runs several scenarios in one launch (a process start, CUDA context
and MPS client each cost seconds; one launch per scenario did not fit the GPU
check's time): SPECS_JSON is a list of {"id", "name", "args", "env"}; each
scenario gets the env set around it, its own process group (a prefix of the
launch's TCPStore), and reports on stdout between "[scenario ID] begin" and
"[scenario ID] ok" or "[scenario ID] FAILED" (the traceback in between), so
the test of each scenario fails by name. A failed scenario aborts its group,
so peers waiting on this rank fail that scenario at once and go on with the
next. Scenarios that end their process (sigkill, abort, p2p_mismatch) run
alone.

FASTPAR_TEST_GPU_LAYOUT picks the GPUs: "distinct" (rank r uses cuda:r, needs
>= WORLD GPUs) or "shared" (every rank on cuda:0: one GPU is enough; NCCL
cannot run there, so every CUDA collective must go over CUDA IPC or be
refused by name). Each scenario asserts on its own results; a failed assert
exits non-zero with the traceback on stderr. Needs a CUDA build of fastpar."""
from __future__ import annotations

import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import fastpar
import fastpar.distributed as fd

SCENARIO, RANK, WORLD, PORT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ARGS = sys.argv[5:]
STORE_PREFIX = ""  # a batch gives each scenario its own keys of the one TCPStore
_BASE_STORE = None


def group_timeout_s() -> float:
    """The scenario's group timeout (read at each init: a batch sets it per scenario)."""
    return float(os.environ.get("FASTPAR_TEST_TIMEOUT_S", "60"))


def base_store():
    global _BASE_STORE
    if _BASE_STORE is None:
        _BASE_STORE = dist.TCPStore("127.0.0.1", PORT, WORLD, RANK == 0, timeout=datetime.timedelta(seconds=60),
                                    wait_for_workers=False)
    return _BASE_STORE


LAYOUT = os.environ.get("FASTPAR_TEST_GPU_LAYOUT", "distinct")
assert LAYOUT in ("distinct", "shared"), LAYOUT
SHARED = LAYOUT == "shared"
DEV = torch.device("cuda", 0 if SHARED else RANK)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32, torch.int64]
FLOATS = {torch.float32, torch.float64, torch.float16, torch.bfloat16}
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
MAX_IPC = int(os.environ.get("FASTPAR_CUDA_IPC_MAX_BYTES", 8 << 20))


def init(backend="cpu:fastpar,cuda:fastpar", timeout_s=None, device_id=None):
    torch.cuda.set_device(DEV)
    store = base_store()
    if STORE_PREFIX:
        store = dist.PrefixStore(STORE_PREFIX, store)
    dist.init_process_group(backend, store=store, rank=RANK, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=timeout_s or group_timeout_s()), device_id=device_id)
    return store


def cuda_backend(group=None):
    b = fd.get_fastpar_backend(group).cuda_engine
    assert isinstance(b, fastpar._C.CudaEngine), type(b)
    return b


def peer_access_everywhere() -> bool:
    """Whether the group gets CUDA IPC: ranks on one GPU always do, ranks on
    several GPUs where every pair has peer access."""
    if SHARED:
        return True
    return all(torch.cuda.can_device_access_peer(a, b) for a in range(WORLD) for b in range(WORLD) if a != b)


def random_data(rank, n, dtype, seed):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if dtype in FLOATS:
        return torch.randn(n, generator=g, dtype=torch.float64).mul(4).to(dtype)
    lo, hi = (0, 4) if dtype == torch.uint8 else (-3, 4)
    return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dtype)


def exact_data(rank, n, dtype, seed):
    """Small integers: every order of summation or multiplication gives the
    same bits (what NCCL, whose order is its own, can be held to)."""
    v = (torch.arange(n, dtype=torch.int64) * 7 + rank * 3 + seed) % 5
    if dtype != torch.uint8:
        v = v - 2
    return v.to(dtype)


def in_rank_order(xs, op, dtype):
    """The IPC kernels' result: ranks combined in order 0..n-1 in fp32 for
    16-bit floats (the dtype itself otherwise), AVG divided once, rounded once."""
    acc_t = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    acc = xs[0].to(acc_t)
    for x in xs[1:]:
        x = x.to(acc_t)
        acc = {dist.ReduceOp.SUM: torch.add, dist.ReduceOp.AVG: torch.add, dist.ReduceOp.PRODUCT: torch.mul,
               dist.ReduceOp.MIN: torch.minimum, dist.ReduceOp.MAX: torch.maximum}[op](acc, x)
    if op == dist.ReduceOp.AVG and dtype in FLOATS:
        acc = acc / len(xs)
    elif op == dist.ReduceOp.AVG:  # NCCL's: the wrapped sum, divided truncating toward zero
        acc = torch.div(acc.to(torch.int64), len(xs), rounding_mode="trunc")
    return acc.to(dtype)


def same_bits_everywhere(t: torch.Tensor, what: str):
    b = t.contiguous().view(torch.uint8).flatten()
    gathered = [torch.empty_like(b) for _ in range(WORLD)]
    dist.all_gather(gathered, b)  # CUDA IPC (NCCL above the threshold on distinct GPUs)
    for q in range(WORLD):
        assert torch.equal(gathered[q], b), f"{what}: rank {q} has different bits than rank {RANK}"


def ops_for(dtype):
    return OPS


# ---------------------------------------------------------------- scenarios


def sc_allreduce():
    """Every op x dtype at IPC sizes (bitwise = in rank order) and above the
    IPC threshold (NCCL; exact data, so bitwise too, except AVG); every rank's
    bits identical; the calls took the route the policy says."""
    init()
    cb = cuda_backend()
    ipc_sizes = [1, 17, 1000, 100_003]
    seed = 0
    for dtype in DTYPES:
        for op in ops_for(dtype):
            for n in ipc_sizes:
                seed += 1
                xs = [random_data(q, n, dtype, seed) for q in range(WORLD)]
                t = xs[RANK].to(DEV)
                dist.all_reduce(t, op=op)
                what = f"IPC-size all_reduce {dtype} {op} n={n}"
                want = in_rank_order(xs, op, dtype)
                if cb.ipc_state.startswith("ipc"):
                    assert torch.equal(t.cpu(), want), f"{what}: got {t[:6]} want {want[:6]}"
                else:  # no peer access: NCCL, whose summation order is its own
                    torch.testing.assert_close(t.cpu(), want, rtol=2e-2, atol=1e-2)
                same_bits_everywhere(t, what)
            # Above the threshold: NCCL on distinct GPUs, IPC (rank order) on a shared one.
            n = MAX_IPC // torch.empty(0, dtype=dtype).element_size() + 1
            xs = [exact_data(q, n, dtype, seed) for q in range(WORLD)]
            t = xs[RANK].to(DEV)
            dist.all_reduce(t, op=op)
            what = f"above-threshold all_reduce {dtype} {op} n={n}"
            want = in_rank_order(xs, op, dtype)
            if op == dist.ReduceOp.AVG and dtype in FLOATS and not SHARED:
                torch.testing.assert_close(t.cpu(), want)
            else:
                assert torch.equal(t.cpu(), want), what
            same_bits_everywhere(t, what)
    # Exactly at the threshold: still IPC (inclusive).
    calls = cb.ipc_calls
    t = torch.ones(MAX_IPC // 4, device=DEV)
    dist.all_reduce(t)
    assert torch.all(t == WORLD)
    if peer_access_everywhere():
        assert cb.ipc_state.startswith(f"ipc on cuda:{DEV.index}"), cb.ipc_state
        assert cb.ipc_calls == calls + 1, (calls, cb.ipc_calls)
        if SHARED:
            assert cb.shares_gpu and cb.fallback_calls == 0, (cb.shares_gpu, cb.fallback_calls)
        else:
            assert cb.fallback_calls >= len(DTYPES), cb.fallback_calls
    # Dense but not contiguous (channels_last) and dtypes the kernels lack go
    # to NCCL on every rank alike; on a shared GPU, where NCCL cannot run,
    # they are refused by name.
    ref = torch.arange(120, dtype=torch.float32).reshape(2, 3, 4, 5)
    m = ref.to(DEV).contiguous(memory_format=torch.channels_last)
    b = torch.ones(5, dtype=torch.bool, device=DEV)
    before = cb.fallback_calls
    if SHARED:
        for x, why in ((m, "not contiguous"), (b, "dtype")):
            try:
                dist.all_reduce(x)
                raise AssertionError(f"all_reduce ({why}) on a shared GPU did not raise")
            except ValueError as e:
                assert "fastpar.all_reduce: ranks of this group share a GPU" in str(e) and why in str(e), str(e)
    else:
        dist.all_reduce(m)
        assert torch.equal(m.cpu(), ref * WORLD)
        dist.all_reduce(b)  # NCCL: SUM over bool is a logical or
        assert bool(b.all())
        assert cb.fallback_calls == before + 2
    # The same tensor on a non-default stream: ordered on that stream.
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        t = torch.full((4096,), float(RANK + 1), device=DEV)
        dist.all_reduce(t)
        got = t.cpu()
    assert torch.all(got == WORLD * (WORLD + 1) / 2)
    dist.destroy_process_group()
    print(f"allreduce rank {RANK} ok", flush=True)


def check_equal(got: torch.Tensor, want: torch.Tensor, what: str, exact: bool):
    if exact:
        assert torch.equal(got.cpu(), want), f"{what}: got {got.flatten()[:6]} want {want.flatten()[:6]}"
    else:
        torch.testing.assert_close(got.cpu(), want, rtol=2e-2, atol=1e-2, msg=lambda m: f"{what}: {m}")


def sc_collectives():
    """broadcast (every root), reduce (every root, every op), all_gather,
    all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, their
    coalesced forms and all_gather_coalesced, every dtype, sizes 0..above one slot: bitwise against a
    reference (IPC reduces in rank order); with IPC on, every call went over
    IPC (a shared GPU: also above FASTPAR_CUDA_IPC_MAX_BYTES)."""
    init()
    cb = cuda_backend()
    ipc = peer_access_everywhere()
    sizes = [0, 1, 17, 1000, 100_003]
    seed = 100
    for dtype in DTYPES:
        for n in sizes:
            seed += 1
            xs = [exact_data(q, n, dtype, seed) for q in range(WORLD)]
            for root in range(WORLD):
                t = xs[RANK].to(DEV)
                dist.broadcast(t, src=root)
                check_equal(t, xs[root], f"broadcast {dtype} n={n} root={root}", True)
            out = [torch.full((n,), 7, dtype=dtype, device=DEV) for _ in range(WORLD)]
            dist.all_gather(out, xs[RANK].to(DEV))
            for q in range(WORLD):
                check_equal(out[q], xs[q], f"all_gather {dtype} n={n} [{q}]", True)
            flat = torch.empty(WORLD * n, dtype=dtype, device=DEV)
            dist.all_gather_into_tensor(flat, xs[RANK].to(DEV))
            check_equal(flat, torch.cat(xs), f"all_gather_into_tensor {dtype} n={n}", True)
            for op in ops_for(dtype):
                want = in_rank_order(xs, op, dtype)
                exact = ipc or op != dist.ReduceOp.AVG or dtype not in FLOATS
                root = (seed + int(op)) % WORLD
                t = xs[RANK].to(DEV)
                dist.reduce(t, dst=root, op=op)
                if RANK == root:
                    check_equal(t, want, f"reduce {dtype} {op} n={n} root={root}", exact)
                else:
                    check_equal(t, xs[RANK], f"reduce {dtype} {op} n={n}: a non-root's tensor changed", True)
                full = [exact_data(q, WORLD * n, dtype, seed + 1) for q in range(WORLD)]
                want_rs = in_rank_order(full, op, dtype)[RANK * n:(RANK + 1) * n]
                o = torch.empty(n, dtype=dtype, device=DEV)
                dist.reduce_scatter_tensor(o, full[RANK].to(DEV), op=op)
                check_equal(o, want_rs, f"reduce_scatter_tensor {dtype} {op} n={n}", exact)
                o2 = torch.empty(n, dtype=dtype, device=DEV)
                dist.reduce_scatter(o2, [c.to(DEV) for c in full[RANK].chunk(WORLD)] if n else
                                    [torch.empty(0, dtype=dtype, device=DEV) for _ in range(WORLD)], op=op)
                check_equal(o2, want_rs, f"reduce_scatter {dtype} {op} n={n}", exact)
    # Coalesced forms (what FSDP issues): the fast path of _coalescing_manager
    # (no device) hands the whole list to the backend in one call.
    xs = [[exact_data(q, n, torch.float32, 9 + n) for n in (5, 1000)] for q in range(WORLD)]
    outs = [torch.empty(WORLD * x.numel(), device=DEV) for x in xs[RANK]]
    with dist._coalescing_manager():
        for o, x in zip(outs, xs[RANK]):
            dist.all_gather_into_tensor(o, x.to(DEV))
    for i, o in enumerate(outs):
        check_equal(o, torch.cat([xs[q][i] for q in range(WORLD)]), f"coalesced all_gather_into_tensor [{i}]", True)
    fulls = [[exact_data(q, WORLD * n, torch.float32, 11 + n) for n in (3, 500)] for q in range(WORLD)]
    rs = [torch.empty(f.numel() // WORLD, device=DEV) for f in fulls[RANK]]
    with dist._coalescing_manager():
        for o, f in zip(rs, fulls[RANK]):
            dist.reduce_scatter_tensor(o, f.to(DEV))
    for i, o in enumerate(rs):
        m = o.numel()
        want = in_rank_order([fulls[q][i] for q in range(WORLD)], dist.ReduceOp.SUM, torch.float32)
        check_equal(o, want[RANK * m:(RANK + 1) * m], f"coalesced reduce_scatter_tensor [{i}]", True)
    # all_gather_coalesced (lists of lists; deprecated in torch, still served).
    lists = [[torch.full((x.numel(),), 7.0, device=DEV) for x in xs[RANK]] for _ in range(WORLD)]  # [rank][input]
    dist.all_gather_coalesced(lists, [x.to(DEV) for x in xs[RANK]])
    for q, lst in enumerate(lists):
        for i in range(len(xs[RANK])):
            check_equal(lst[i], xs[q][i], f"all_gather_coalesced [{q}][{i}]", True)
    ts = [x.to(DEV) for x in xs[RANK]]
    with dist._coalescing_manager():
        for t in ts:
            dist.all_reduce(t)
    for i, t in enumerate(ts):
        check_equal(t, in_rank_order([xs[q][i] for q in range(WORLD)], dist.ReduceOp.SUM, torch.float32),
                    f"coalesced all_reduce [{i}]", True)
    # Above the threshold: NCCL on distinct GPUs, IPC on a shared one.
    big = MAX_IPC // 4 + 16
    xs = [exact_data(q, big, torch.float32, 77) for q in range(WORLD)]
    t = xs[RANK].to(DEV)
    before_ipc, before_fb = cb.ipc_calls, cb.fallback_calls
    dist.broadcast(t, src=0)
    check_equal(t, xs[0], "broadcast above the threshold", True)
    if ipc:
        if SHARED:
            assert cb.ipc_calls == before_ipc + 1 and cb.fallback_calls == before_fb, (cb.ipc_calls, cb.fallback_calls)
        else:
            assert cb.fallback_calls == before_fb + 1, (cb.ipc_calls, cb.fallback_calls)
        assert cb.ipc_calls > 100, cb.ipc_calls
    dist.barrier()
    dist.destroy_process_group()
    print(f"collectives rank {RANK} ok", flush=True)


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
        # The CUDA backend's own barrier (what a "cpu:gloo,cuda:fastpar" group
        # reaches): one IPC phase, and wait() returns once every rank arrived.
        fb = cb.fallback_calls
        for _ in range(3):
            cb.barrier().wait()
        assert cb.ipc_calls == calls0 + 6 and cb.fallback_calls == fb, (cb.ipc_calls, cb.fallback_calls)
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()
    print(f"root_and_alltoall rank {RANK} ok", flush=True)


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


def sc_ddp():
    """Stock DistributedDataParallel and fastpar.DistributedDataParallel on
    cuda:fastpar match the same model trained with DDP on a reference group:
    cuda:nccl on distinct GPUs, cpu:gloo on CPU copies on a shared GPU (NCCL
    cannot run there). Rank 1 starts from different weights: the start-up
    broadcast must fix them."""
    init()
    ref_group = dist.new_group(backend="gloo" if SHARED else "nccl")
    ref_dev = torch.device("cpu") if SHARED else DEV
    torch.manual_seed(0)
    make = lambda: torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    net = make()
    models = {}
    for name, group, dev in (("stock", None, DEV), ("fastpar", None, DEV), ("reference", ref_group, ref_dev)):
        replica = make().to(dev)
        replica.load_state_dict(net.state_dict())
        if RANK == 1 and name != "reference":
            with torch.no_grad():
                for p in replica.parameters():
                    p.add_(1.0)
        ids = [DEV.index] if dev.type == "cuda" else None
        if name == "fastpar":
            ddp = fastpar.DistributedDataParallel(replica, device_ids=ids, process_group=group, bucket_cap_mb=1)
        else:
            ddp = torch.nn.parallel.DistributedDataParallel(replica, device_ids=ids, process_group=group,
                                                            bucket_cap_mb=1)
        models[name] = (ddp, torch.optim.SGD(ddp.parameters(), lr=0.1), dev)
    for step in range(5):
        g = torch.Generator().manual_seed(step * 100 + RANK)
        x = torch.randn(32, 64, generator=g)
        y = torch.randint(0, 10, (32,), generator=g)
        for ddp, opt, dev in models.values():
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x.to(dev)), y.to(dev)).backward()
            opt.step()
    ref_params = [p.detach().cpu() for p in models["reference"][0].parameters()]
    for name in ("stock", "fastpar"):
        for (n1, p1), p2 in zip(models[name][0].named_parameters(), ref_params):
            if WORLD == 2 and not SHARED:  # two addends and the same GPU kernels: the same bits
                assert torch.equal(p1.cpu(), p2), f"{name} DDP: {n1} differs from the reference"
            else:
                torch.testing.assert_close(p1.cpu(), p2, rtol=1e-4, atol=1e-5,
                                           msg=lambda m: f"{name} DDP: {n1}: {m}")
    if peer_access_everywhere():
        assert cuda_backend().ipc_calls >= 10, cuda_backend().ipc_calls
    if SHARED:
        assert cuda_backend().fallback_calls == 0, cuda_backend().fallback_calls
    registered = int(os.environ.get("FASTPAR_CUDA_IPC_REGISTERED_BYTES", "0")) > 0
    from fastpar.bucket_storage import storage_kind
    assert storage_kind(None, DEV) == ("registered" if registered else "torch.empty"), storage_kind(None, DEV)
    dist.destroy_process_group()
    print(f"ddp rank {RANK} ok", flush=True)


def sc_sigkill():
    """The last rank is SIGKILLed between collectives; every survivor's next
    IPC collective must raise DistBackendError naming the op and the dead rank
    within seconds, long before the (60 s) group timeout: the peer watcher
    sees the death in /proc and raises the host abort word the phase kernels
    poll. ARGS[0]: "blocking" (FASTPAR_BLOCKING_WAIT=1: wait() raises) or
    "async" (the default wait(): it synchronizes once a peer is dead);
    ARGS[1]: the op ("all_reduce" or "broadcast")."""
    mode, op = ARGS[0], ARGS[1]
    init(timeout_s=60)
    t = torch.ones(1024, device=DEV)
    dist.all_reduce(t)
    assert torch.all(t == WORLD)
    assert cuda_backend().ipc_state.startswith("ipc"), cuda_backend().ipc_state
    torch.cuda.synchronize()
    dist.barrier()  # CPU: every rank is past the first all_reduce
    dead = WORLD - 1
    if RANK == dead:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    t0 = time.monotonic()

    def step(what):  # where the time goes, should a run ever hang again (issue 20, defect 3)
        print(f"[{time.monotonic() - t0:6.2f}s] {what}", flush=True)
    try:
        work = dist.all_reduce(t, async_op=True) if op == "all_reduce" else dist.broadcast(t, src=0, async_op=True)
        step(f"{op} enqueued")
        work.wait()
        step("wait() returned")
        torch.cuda.synchronize()
        step("synchronize() returned")
        dist.all_reduce(t)  # refused at the start if wait() did not raise
        raise AssertionError("no error after the peer was killed")
    except dist.DistBackendError as e:
        msg = str(e)
        elapsed = time.monotonic() - t0
        print(f"raised after {elapsed:.1f}s: {msg}", flush=True)
        assert f"rank {RANK}" in msg and f"rank {dead} (pid" in msg and "exited" in msg, msg
        assert op in msg or "all_reduce" in msg, msg
        assert elapsed < 10, f"took {elapsed:.1f}s: the watcher should stop the kernels within seconds"
    assert cuda_backend().dead_peer == dead, cuda_backend().dead_peer
    # abort must not wait for anything: the arena is abandoned, no process stays stuck.
    t1 = time.monotonic()
    dist.destroy_process_group()
    print(f"destroy after the death took {time.monotonic() - t1:.1f}s", flush=True)
    total = time.monotonic() - t0
    assert total < 10, f"the scenario took {total:.1f}s after the death (the issue's bound: 10 s)"
    os._exit(0)


def sc_desync():
    """Ranks call different collectives (ARGS[0]: "numel" - all_reduce of
    different sizes; "root" - broadcast from different roots; "op" - all_reduce
    vs all_gather_into_tensor of equal bytes): every rank raises
    DistBackendError naming both calls (or, where a peer gave up first, that
    it aborted), and the group
    is unusable afterwards (the next call raises at once)."""
    init(timeout_s=30)
    t = torch.ones(16, device=DEV)
    dist.all_reduce(t)
    variant = ARGS[0]
    try:
        if variant == "numel":
            w = dist.all_reduce(torch.ones(100 + (RANK == 0) * 4, device=DEV), async_op=True)
        elif variant == "root":
            w = dist.broadcast(torch.ones(100, device=DEV), src=min(RANK, 1), async_op=True)
        else:
            if RANK == 0:
                w = dist.all_reduce(torch.ones(100 * WORLD, device=DEV), async_op=True)
            else:
                w = dist.all_gather_into_tensor(torch.empty(100 * WORLD, device=DEV), torch.ones(100, device=DEV),
                                                async_op=True)
        w.wait()
        torch.cuda.synchronize()
        dist.all_reduce(t)
        raise AssertionError("a desynced call did not raise")
    except dist.DistBackendError as e:
        msg = str(e)
        print(f"raised: {msg}", flush=True)
        assert "collective mismatch" in msg or "aborted" in msg, msg
        if "collective mismatch" in msg:
            # Both calls named, in the CPU path's words (this rank's first).
            mine = {"numel": f"allreduce(count={100 + (RANK == 0) * 4}, dtype=float32",
                    "root": f"broadcast(count=100, dtype=float32, root={min(RANK, 1)})",
                    "op": f"allreduce(count={100 * WORLD}" if RANK == 0 else "allgather(count=100"}[variant]
            assert f"rank {RANK} called {mine}" in msg and " but rank " in msg, msg
    try:
        dist.broadcast(t, src=0)
        raise AssertionError("the group was usable after a failure")
    except dist.DistBackendError as e:
        assert "fastpar: broadcast over CUDA IPC failed" in str(e), str(e)
    dist.destroy_process_group()
    print(f"desync rank {RANK} ok", flush=True)


def sc_abort():
    """Rank 0 waits in an all_reduce that rank 1 never joins; a thread of
    rank 0 aborts the group after 1 s: the kernel stops (host abort word) and
    the process exits promptly instead of waiting out the 60 s timeout."""
    import threading
    init(timeout_s=60)
    t = torch.ones(16, device=DEV)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    dist.barrier()
    if RANK == 0:
        threading.Timer(1.0, cuda_backend().abort).start()
        t0 = time.monotonic()
        dist.all_reduce(t)
        torch.cuda.synchronize()  # returns once the aborted kernel gives up
        elapsed = time.monotonic() - t0
        print(f"aborted kernel returned after {elapsed:.1f}s", flush=True)
        assert elapsed < 20, elapsed
        try:
            dist.all_reduce(t)
            raise AssertionError("no error after abort()")
        except dist.DistBackendError as e:
            assert "aborted" in str(e), str(e)
    else:
        time.sleep(3)
    os._exit(0)


def sc_p2p():
    """send/recv over CUDA IPC (after one collective has set IPC up): every
    ordered pair at once through batch_isend_irecv, every dtype, sizes from 0
    to more chunks than a ring holds, messages matched in order per pair with
    their tags; isend/irecv with wait(); the receiver's stream waits for the
    data; a receive from any source is refused by name on a shared GPU."""
    init()
    cb = cuda_backend()
    dist.all_reduce(torch.ones(1, device=DEV))  # sets the group's IPC communicator up
    ipc = peer_access_everywhere()
    calls0, fb0 = cb.ipc_calls, cb.fallback_calls
    seed = 900
    for dtype in DTYPES:
        for n in (0, 1, 17, 1000, 100_003, (1 << 20) + 5):
            seed += 1
            ops, got = [], {}
            for q in range(WORLD):
                if q == RANK:
                    continue
                ops.append(dist.P2POp(dist.isend, exact_data(RANK * 7 + q, n, dtype, seed).to(DEV), q, tag=q))
                got[q] = torch.full((n,), 3, dtype=dtype, device=DEV)
                ops.append(dist.P2POp(dist.irecv, got[q], q, tag=RANK))
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            for q, t in got.items():
                check_equal(t, exact_data(q * 7 + RANK, n, dtype, seed), f"batch_isend_irecv {dtype} n={n} from {q}",
                            True)
    # Several messages to one peer, in order, different tags and sizes.
    if RANK in (0, 1):
        peer = 1 - RANK
        sizes = [5, 0, 300_000, 7]
        if RANK == 0:
            works = [dist.isend(torch.arange(k, dtype=torch.float32, device=DEV) + i, dst=peer, tag=i)
                     for i, k in enumerate(sizes)]
        else:
            bufs = [torch.empty(k, device=DEV) for k in sizes]
            works = [dist.irecv(b, src=peer, tag=i) for i, b in enumerate(bufs)]
        for w in works:
            w.wait()
        if RANK == 1:
            # wait() ordered this stream after the receives: no synchronize needed.
            for i, (k, b) in enumerate(zip(sizes, bufs)):
                check_equal(b, torch.arange(k, dtype=torch.float32) + i, f"isend/irecv message {i}", True)
        # Blocking send/recv.
        if RANK == 0:
            dist.send(torch.full((33,), 2.5, device=DEV), dst=1, tag=7)
        else:
            t = torch.empty(33, device=DEV)
            dist.recv(t, src=0, tag=7)
            check_equal(t, torch.full((33,), 2.5), "send/recv", True)
    if ipc:
        assert cb.fallback_calls == fb0, (cb.fallback_calls, fb0)
        assert cb.ipc_calls > calls0
    if SHARED:
        try:
            dist.recv(torch.empty(1, device=DEV))
            raise AssertionError("recv from any source on a shared GPU did not raise")
        except ValueError as e:
            assert "fastpar.recv: a receive from any source" in str(e), str(e)
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()
    print(f"p2p rank {RANK} ok", flush=True)


def sc_p2p_first():
    """init_process_group(device_id=...) sets CUDA IPC up when the group is
    created, so send/recv as the group's first CUDA calls run over IPC (on a
    shared GPU, where NCCL cannot run, they would otherwise be refused); then
    a new group inherits the bound device and is set up at creation too."""
    init(device_id=DEV)
    cb = cuda_backend()
    ipc = peer_access_everywhere()
    assert cb.ipc_state != "not set up", cb.ipc_state
    if ipc:
        assert cb.ipc_state.startswith("ipc"), cb.ipc_state
    peer = RANK ^ 1
    if peer < WORLD:
        x = torch.arange(1000, dtype=torch.float32, device=DEV) + RANK
        got = torch.empty(1000, device=DEV)
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, got, peer)]):
            w.wait()
        check_equal(got, torch.arange(1000, dtype=torch.float32) + peer, "send/recv before any collective", True)
        if ipc:
            assert cb.fallback_calls == 0 and cb.ipc_calls >= 2, (cb.fallback_calls, cb.ipc_calls)
    g = dist.new_group(list(range(WORLD)))
    assert cuda_backend(g).ipc_state != "not set up", cuda_backend(g).ipc_state
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()
    print(f"p2p_first rank {RANK} ok", flush=True)


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


def sc_p2p_mismatch():
    """Rank 0 sends with tag 1 (or 100 elements), rank 1 receives with tag 2
    (or 50 elements, ARGS[0] = "size"): rank 1's receive fails with
    DistBackendError naming recv (FASTPAR_BLOCKING_WAIT=1 raises it at wait())
    and never writes its buffer; rank 0's send completes (it fits the ring)."""
    store = init()
    dist.all_reduce(torch.ones(1, device=DEV))
    by_size = ARGS and ARGS[0] == "size"
    if RANK == 0:
        dist.send(torch.ones(100, device=DEV), dst=1, tag=1)
        torch.cuda.synchronize()
        # Rank 1's receive reads our ring: our arena must outlive its checks.
        store.wait(["mismatch checked"], datetime.timedelta(seconds=2 * group_timeout_s()))
    elif RANK == 1:
        t = torch.full((50 if by_size else 100,), 3.0, device=DEV)
        try:
            dist.recv(t, src=0, tag=1 if by_size else 2)
            raise AssertionError("mismatched recv did not raise")
        except dist.DistBackendError as e:
            assert "recv over CUDA IPC failed on rank 1" in str(e), str(e)
            assert "tag or size" in str(e), str(e)
        assert bool((t.cpu() == 3.0).all()), "mismatched receive wrote its buffer"
        store.set("mismatch checked", "1")
    time.sleep(1)
    os._exit(0)


def sc_registered():
    """registered_empty on CUDA (FASTPAR_CUDA_IPC_REGISTERED_BYTES set by the
    test): tensors in the IPC arena, all_reduce on them above the one-shot
    sizes without the copy-in (several slot-sized chunks with the test's
    small slot), bitwise against the in-rank-order reference; buffers freed
    and reused in the same order on every rank; an arena too small on every
    rank raises ValueError and leaves the group usable; a registered tensor on
    one rank against a plain one on another fails on every rank with both
    calls named."""
    init()
    cb = cuda_backend()
    seed = 900
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        for op in ops_for(dtype):
            for n in (1, 70_001, 300_000):
                seed += 1
                t = fd.registered_empty((n,), dtype, device=DEV)
                assert t.device == DEV and cb.is_registered(t), (t.device, cb.is_registered(t))
                xs = [exact_data(q, n, dtype, seed) for q in range(WORLD)]
                t.copy_(xs[RANK].to(DEV))
                dist.all_reduce(t, op=op)
                check_equal(t, in_rank_order(xs, op, dtype), f"registered all_reduce {dtype} {op} n={n}", True)
                del t
    assert not cb.is_registered(torch.ones(4, device=DEV))
    try:
        fd.registered_empty((cb.registered_bytes,), torch.float32, device=DEV)
        raise AssertionError("a registered tensor larger than the arena was allocated")
    except ValueError as e:
        assert "do not fit in the free space of the CUDA IPC registered arena" in str(e), str(e)
    t = torch.ones(1000, device=DEV)
    dist.all_reduce(t)
    check_equal(t, torch.full((1000,), float(WORLD)), "all_reduce after a refused registration", True)
    big = 300_000  # above the one-shot sizes: rank 0's goes registered, the others' two-shot
    # registered_empty is collective (as on the CPU path): every rank allocates,
    # then only rank 0 passes its registered tensor to all_reduce.
    reg = fd.registered_empty((big,), torch.float32, device=DEV)
    t = reg.fill_(1) if RANK == 0 else torch.ones(big, device=DEV)
    try:
        dist.all_reduce(t)
        torch.cuda.synchronize()
        dist.all_reduce(torch.ones(1, device=DEV))
        raise AssertionError("registered on one rank, plain on another, did not raise")
    except dist.DistBackendError as e:
        msg = str(e)
        assert "collective mismatch" in msg or "aborted" in msg, msg
        if "collective mismatch" in msg:
            assert "registered offset=" in msg and "schedule=two_shot" in msg, msg
    torch.cuda.synchronize()
    dist.destroy_process_group()
    print(f"registered rank {RANK} ok", flush=True)


def sc_registered_alone():
    """registered_empty is collective (every rank calls it, as on the CPU
    path): rank 0 allocating while the others call all_reduce fails on every
    rank within seconds (the descriptors differ at once; the group's timeout
    is not waited out), rank 0's error naming registered_empty and its bytes
    against the peer's all_reduce."""
    init(timeout_s=30)
    dist.all_reduce(torch.ones(16, device=DEV))  # sets IPC up on every rank first
    torch.cuda.synchronize()
    t0 = time.monotonic()
    try:
        if RANK == 0:
            fd.registered_empty((300_000,), torch.float32, device=DEV)
        else:
            dist.all_reduce(torch.ones(300_000, device=DEV))
            torch.cuda.synchronize()
            dist.all_reduce(torch.ones(1, device=DEV))
        raise AssertionError("registered_empty on one rank alone did not raise")
    except dist.DistBackendError as e:
        msg, elapsed = str(e), time.monotonic() - t0
        print(f"raised after {elapsed:.1f}s: {msg}", flush=True)
        assert "collective mismatch" in msg or "aborted" in msg, msg
        if RANK == 0:
            assert "registered_empty over CUDA IPC failed on rank 0" in msg, msg
        if "collective mismatch" in msg:
            assert "registered_empty(bytes=1200000, offset=" in msg and "allreduce(count=300000" in msg, msg
        assert elapsed < 15, f"took {elapsed:.1f}s: a mismatch shows at once, not at the 30 s timeout"
    dist.destroy_process_group()
    print(f"registered_alone rank {RANK} ok", flush=True)


def run_batch(specs):
    """The scenarios of `specs` in turn, one process group each (scenario_batch.py)."""
    from scenario_batch import run_batch as run

    def run_one(spec, prefix):
        global ARGS, STORE_PREFIX
        ARGS, STORE_PREFIX = [str(a) for a in spec.get("args", [])], prefix
        globals()["sc_" + spec["name"]]()

    def on_failure():
        if dist.is_initialized():
            try:
                cuda_backend().abort()  # peers waiting on this rank fail now, not at their timeout
            finally:
                dist.destroy_process_group()

    run(specs, RANK, WORLD, base_store(), run_one, on_failure)
    torch.cuda.synchronize()


if __name__ == "__main__":
    if SCENARIO == "batch":
        run_batch(ARGS[0])
    else:
        globals()["sc_" + SCENARIO]()
