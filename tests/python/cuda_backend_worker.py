"""Scenarios of test_cuda_backend.py, one process per rank and one GPU each
(rank r uses cuda:r):

    python cuda_backend_worker.py SCENARIO RANK WORLD PORT [ARGS...]

Each scenario asserts on its own results; a failed assert exits non-zero with
the traceback on stderr. Needs >= WORLD GPUs and a CUDA build of fastpar."""
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
TIMEOUT_S = float(os.environ.get("FASTPAR_TEST_TIMEOUT_S", "60"))
DEV = torch.device("cuda", RANK)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32, torch.int64]
FLOATS = {torch.float32, torch.float64, torch.float16, torch.bfloat16}
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
MAX_IPC = int(os.environ.get("FASTPAR_CUDA_IPC_MAX_BYTES", 8 << 20))


def init(backend="cpu:fastpar,cuda:fastpar", timeout_s=TIMEOUT_S):
    torch.cuda.set_device(DEV)
    store = dist.TCPStore("127.0.0.1", PORT, WORLD, RANK == 0, timeout=datetime.timedelta(seconds=60),
                          wait_for_workers=False)
    dist.init_process_group(backend, store=store, rank=RANK, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=timeout_s))


def cuda_backend(group=None):
    b = fd.get_fastpar_backend(group).cuda_backend
    assert isinstance(b, fastpar._C.CudaBackend), type(b)
    return b


def peer_access_everywhere() -> bool:
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
    if op == dist.ReduceOp.AVG:
        acc = acc / len(xs)
    return acc.to(dtype)


def same_bits_everywhere(t: torch.Tensor, what: str):
    b = t.contiguous().view(torch.uint8).flatten()
    gathered = [torch.empty_like(b) for _ in range(WORLD)]
    dist.all_gather(gathered, b)  # CUDA: through the NCCL fallback
    for q in range(WORLD):
        assert torch.equal(gathered[q], b), f"{what}: rank {q} has different bits than rank {RANK}"


def ops_for(dtype):
    return [op for op in OPS if op != dist.ReduceOp.AVG or dtype in FLOATS]


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
            # Above the threshold: NCCL.
            n = MAX_IPC // torch.empty(0, dtype=dtype).element_size() + 1
            xs = [exact_data(q, n, dtype, seed) for q in range(WORLD)]
            t = xs[RANK].to(DEV)
            dist.all_reduce(t, op=op)
            what = f"above-threshold all_reduce {dtype} {op} n={n}"
            want = in_rank_order(xs, op, dtype)
            if op == dist.ReduceOp.AVG:
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
        assert cb.ipc_state == f"ipc on cuda:{RANK}", cb.ipc_state
        assert cb.ipc_calls == calls + 1, (calls, cb.ipc_calls)
        assert cb.fallback_calls >= len(DTYPES), cb.fallback_calls
    # Dense but not contiguous (channels_last) and dtypes the kernels lack go
    # to NCCL on every rank alike.
    ref = torch.arange(120, dtype=torch.float32).reshape(2, 3, 4, 5)
    m = ref.to(DEV).contiguous(memory_format=torch.channels_last)
    before = cb.fallback_calls
    dist.all_reduce(m)
    assert torch.equal(m.cpu(), ref * WORLD)
    b = torch.ones(5, dtype=torch.bool, device=DEV)
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


def sc_fallback_collectives():
    """broadcast, all_gather, reduce_scatter on CUDA tensors: the NCCL fallback."""
    init()
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for n in (1, 1000, 1 << 20):
            xs = [exact_data(q, n, dtype, 3) for q in range(WORLD)]
            t = xs[RANK].to(DEV)
            dist.broadcast(t, src=WORLD - 1)
            assert torch.equal(t.cpu(), xs[WORLD - 1]), f"broadcast {dtype} {n}"
            out = [torch.empty(n, dtype=dtype, device=DEV) for _ in range(WORLD)]
            dist.all_gather(out, xs[RANK].to(DEV))
            for q in range(WORLD):
                assert torch.equal(out[q].cpu(), xs[q]), f"all_gather {dtype} {n} [{q}]"
            flat = torch.empty(WORLD * n, dtype=dtype, device=DEV)
            dist.all_gather_into_tensor(flat, xs[RANK].to(DEV))
            assert torch.equal(flat.cpu(), torch.cat(xs))
            full = [exact_data(q, WORLD * n, dtype, 5) for q in range(WORLD)]
            o = torch.empty(n, dtype=dtype, device=DEV)
            dist.reduce_scatter_tensor(o, full[RANK].to(DEV))
            want = in_rank_order(full, dist.ReduceOp.SUM, dtype)[RANK * n:(RANK + 1) * n]
            assert torch.equal(o.cpu(), want), f"reduce_scatter_tensor {dtype} {n}"
            o2 = torch.empty(n, dtype=dtype, device=DEV)
            dist.reduce_scatter(o2, [c.to(DEV) for c in full[RANK].chunk(WORLD)])
            assert torch.equal(o2.cpu(), want), f"reduce_scatter {dtype} {n}"
    assert cuda_backend().ipc_state == "not set up"  # no CUDA all_reduce yet: nothing set up
    dist.barrier()
    dist.destroy_process_group()
    print(f"fallback_collectives rank {RANK} ok", flush=True)


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
    dist.destroy_process_group()
    print(f"async rank {RANK} ok", flush=True)


def sc_ddp():
    """Stock DistributedDataParallel on cuda:fastpar matches cuda:nccl."""
    init()
    nccl_group = dist.new_group(backend="nccl")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(DEV)
    models = {}
    for name, group in (("fastpar", None), ("nccl", nccl_group)):
        replica = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(DEV)
        replica.load_state_dict(net.state_dict())
        ddp = torch.nn.parallel.DistributedDataParallel(replica, device_ids=[RANK], process_group=group,
                                                        bucket_cap_mb=1)
        models[name] = (ddp, torch.optim.SGD(ddp.parameters(), lr=0.1))
    for step in range(5):
        g = torch.Generator().manual_seed(step * 100 + RANK)
        x = torch.randn(32, 64, generator=g).to(DEV)
        y = torch.randint(0, 10, (32,), generator=g).to(DEV)
        for ddp, opt in models.values():
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
    for (n1, p1), (_, p2) in zip(models["fastpar"][0].named_parameters(), models["nccl"][0].named_parameters()):
        if WORLD == 2:  # two addends: every order gives the same bits
            assert torch.equal(p1, p2), f"{n1} differs from NCCL DDP"
        else:
            torch.testing.assert_close(p1, p2, rtol=1e-5, atol=1e-6)
    if peer_access_everywhere():
        assert cuda_backend().ipc_calls >= 5, cuda_backend().ipc_calls
    dist.destroy_process_group()
    print(f"ddp rank {RANK} ok", flush=True)


def sc_sigkill():
    """Rank 1 is SIGKILLed between collectives; rank 0's next IPC all_reduce
    must raise DistBackendError within the timeout (plus slack), naming the op,
    the rank and the timeout. ARGS[0]: "blocking" (FASTPAR_BLOCKING_WAIT=1:
    wait() raises) or "async" (the failure is seen by a later call)."""
    init(timeout_s=float(ARGS[1]))
    t = torch.ones(1024, device=DEV)
    dist.all_reduce(t)
    assert torch.all(t == WORLD)
    assert cuda_backend().ipc_state.startswith("ipc"), cuda_backend().ipc_state
    torch.cuda.synchronize()
    dist.barrier()  # CPU: both ranks are past the first all_reduce
    if RANK == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    t0 = time.monotonic()
    try:
        dist.all_reduce(t)
        if ARGS[0] == "async":
            torch.cuda.synchronize()  # the phase kernel gives up at the timeout
            dist.all_reduce(t)  # refused: the communicator recorded the failure
        raise AssertionError("no error after the peer was killed")
    except dist.DistBackendError as e:
        msg = str(e)
        print(f"raised after {time.monotonic() - t0:.1f}s: {msg}", flush=True)
        assert "all_reduce" in msg and "rank 0" in msg and f"{int(float(ARGS[1]) * 1000)} ms" in msg, msg
        assert "timed out" in msg or "aborted" in msg, msg
    os._exit(0)  # the peer is gone: no teardown barrier to wait for


if __name__ == "__main__":
    globals()["sc_" + SCENARIO]()
