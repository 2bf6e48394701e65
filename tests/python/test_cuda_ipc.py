"""torch.classes.fastpar.CudaIpcComm through fastpar.cuda_ipc: allreduce
across processes, one GPU each, over CUDA IPC arenas and the shared flag
protocol, rendezvous through a torch.distributed FileStore.

Needs two or more GPUs and a CUDA build (skips otherwise). The schedules
themselves are also checked without a GPU: test_cuda_host_emulation.py.
"""
import multiprocessing as mp
import traceback

import pytest
import torch

import fastpar

NGPU = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [
    pytest.mark.skipif(NGPU < 2, reason="needs at least 2 CUDA devices"),
    pytest.mark.skipif(not getattr(fastpar._C, "built_with_cuda", False), reason="CPU-only build"),
]

SUM, AVG, PRODUCT, MIN, MAX = 0, 1, 2, 3, 4
SLOT_BYTES = 4096  # small: 1000+ elements already take several chunks (slot rounds)


def rank_data(rank, size, dtype, seed):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    return torch.randn(size, generator=g, dtype=torch.float64).mul(10).to(dtype)


def reference(world, size, dtype, op, seed):
    """In rank order with fp32 accumulation for 16-bit floats: every rank's
    result must equal it bit for bit (one-shot and two-shot alike)."""
    acc_dtype = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    xs = [rank_data(r, size, dtype, seed).to(acc_dtype) for r in range(world)]
    acc = xs[0]
    for x in xs[1:]:
        acc = {SUM: torch.add, AVG: torch.add, PRODUCT: torch.mul, MIN: torch.minimum, MAX: torch.maximum}[op](acc, x)
    if op == AVG:
        acc = acc / world
    return acc.to(dtype)


CASES = [
    (dtype, op, size, algorithm)
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64)
    for op in (SUM, AVG, MAX)
    for size in (1, 17, 1000, 100_003)
    for algorithm in ("one_shot", "two_shot", "auto")
]


def worker(rank, world, store_path, results):
    try:
        import fastpar.cuda_ipc

        torch.cuda.set_device(rank)
        store = torch.distributed.FileStore(store_path, world)
        comm = fastpar.cuda_ipc.connect(store, rank, world, rank, slot_bytes=SLOT_BYTES)
        failures = []
        for i, (dtype, op, size, algorithm) in enumerate(CASES):
            t = rank_data(rank, size, dtype, seed=i).cuda()
            comm.allreduce_(t, op, algorithm)
            comm.check()
            if not torch.equal(t.cpu(), reference(world, size, dtype, op, seed=i)):
                failures.append((str(dtype), op, size, algorithm))
        # In place on a misaligned view, and on a non-default stream.
        base = rank_data(rank, 1001, torch.float32, seed=99).cuda()
        view = base[1:]
        with torch.cuda.stream(torch.cuda.Stream()):
            comm.allreduce_(view, SUM, "two_shot")
            comm.check()
        if not torch.equal(view.cpu(), reference(world, 1001, torch.float32, SUM, seed=99)[1:]):
            failures.append(("misaligned view", SUM, 1000, "two_shot"))
        fastpar.cuda_ipc.close(comm, store, rank, world)
        results.put((rank, failures, None))
    except Exception:
        results.put((rank, None, traceback.format_exc()))


def test_ipc_allreduce_every_rank_matches_reference(tmp_path):
    world = min(NGPU, 8)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    store_path = str(tmp_path / "store")
    procs = [ctx.Process(target=worker, args=(r, world, store_path, results)) for r in range(world)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=900) for _ in range(world)]
    for p in procs:
        p.join(timeout=120)
    for rank, failures, error in outcomes:
        assert error is None, f"rank {rank} raised:\n{error}"
        assert failures == [], f"rank {rank}: wrong results for {failures}"
