"""torch.classes.fastpar.CudaIpcComm: allreduce across processes, one GPU
each, through CUDA IPC arenas and the shared flag protocol.

Needs two or more GPUs (skips otherwise) and a CUDA build. Handles are
exchanged through a multiprocessing queue here; the library's own rendezvous
(a torch.distributed Store) is the Python API's business.
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
SLOT_BYTES = 4096  # small: 1000+ elements already take several chunks (rounds)


def rank_data(rank, size, dtype, seed):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    return torch.randint(-8, 9, (size,), generator=g).to(dtype)


def reference(world, size, dtype, op, seed):
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
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32)
    for op in (SUM, AVG, MAX)
    if not (op == AVG and dtype == torch.int32)
    for size in (1, 17, 1000, 100_003)
    for algorithm in ("one_shot", "two_shot", "auto")
]


def worker(rank, world, handles_out, handles_in, results):
    try:
        torch.cuda.set_device(rank)
        comm = torch.classes.fastpar.CudaIpcComm(rank, world, rank, SLOT_BYTES)
        handles_out.put((rank, comm.handle()))
        table = handles_in[rank].get()
        comm.connect(table)
        failures = []
        for i, (dtype, op, size, algorithm) in enumerate(CASES):
            t = rank_data(rank, size, dtype, seed=i).cuda()
            comm.allreduce_(t, op, algorithm)
            comm.check()
            expected = reference(world, size, dtype, op, seed=i)
            if not torch.equal(t.cpu(), expected):
                failures.append((str(dtype), op, size, algorithm))
        torch.cuda.synchronize()
        results.put((rank, failures, None))
        handles_out.put(("barrier", rank))
        handles_in[rank].get()  # every rank is done before anyone unmaps
        comm.close()
    except Exception:
        results.put((rank, None, traceback.format_exc()))


def test_ipc_allreduce_all_ranks_match_reference():
    world = NGPU if NGPU <= 8 else 8
    ctx = mp.get_context("spawn")
    handles_out = ctx.Queue()
    handles_in = [ctx.Queue() for _ in range(world)]
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, handles_out, handles_in, results)) for r in range(world)]
    for p in procs:
        p.start()
    got = dict(handles_out.get(timeout=120) for _ in range(world))
    table = torch.stack([got[r] for r in range(world)])
    for q in handles_in:
        q.put(table)
    outcomes = [results.get(timeout=600) for _ in range(world)]
    for _ in range(world):
        handles_out.get(timeout=120)
    for q in handles_in:
        q.put(None)
    for p in procs:
        p.join(timeout=120)
    for rank, failures, error in outcomes:
        assert error is None, f"rank {rank} raised:\n{error}"
        assert failures == [], f"rank {rank}: wrong results for {failures}"
