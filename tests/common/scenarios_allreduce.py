"""all_reduce scenarios (dist_worker.py runs them): every op, dtype and size,
the schedules forced, registered buffers (no copy-in), AVG on integers as
NCCL computes it. A scenario that exists on both devices takes DEV
(worker_context.py) and runs the body of that device: on the CPU, shared
memory against `reference`; on CUDA, the IPC kernels bitwise against
`in_rank_order`, and the route each call took (IPC or NCCL) as the routing
policy says."""
from __future__ import annotations

import torch
import torch.distributed as dist

import fastpar.distributed as fd
from reference import DTYPES, FLOATS, INT_AVG_CASES, exact_data, in_rank_order, random_data, reference
from worker_context import (ARGS, DEV, MAX_IPC, RANK, SHARED, WORLD, check, check_equal, cuda_backend, finish, init,
                            ops_for, peer_access_everywhere, same_bits_everywhere)


def sc_allreduce():
    """all_reduce for every dtype, op and size, on DEV."""
    (_allreduce_cuda if DEV.type == "cuda" else _allreduce_cpu)()


def sc_allreduce_forced():
    """CPU all_reduce with the schedule ARGS[0] ("one_shot" or "two_shot")
    forced for the sizes that allow it."""
    init()
    fd.get_fastpar_backend()._set_allreduce_tuning(-1, {"one_shot": 1, "two_shot": 2}[ARGS[0]])
    _check_allreduce_cpu(sizes=(0, 1, 33, 999))
    finish()


def _allreduce_cpu():
    init()
    _check_allreduce_cpu()
    finish()


def _check_allreduce_cpu(sizes=(0, 1, 7, 1000, 5003)):
    """all_reduce for every dtype, op and size (0, 1, odd, < slot, > slot)."""
    for dtype in DTYPES:
        for op in ops_for(dtype):
            for n in sizes:
                xs = [exact_data(q, n, dtype) for q in range(WORLD)]
                t = xs[RANK].clone()
                dist.all_reduce(t, op=op)
                what = f"all_reduce {dtype} {op} n={n}"
                check(t, reference(xs, op), what, exact=op != dist.ReduceOp.AVG)
                if op == dist.ReduceOp.AVG:
                    same_bits_everywhere(t, what)
    # async: wait() and get_future() as torch's
    t = exact_data(RANK, 100, torch.float32)
    work = dist.all_reduce(t, async_op=True)
    assert work.wait() is True
    assert work.is_completed()
    fut = work.get_future().wait()
    want = reference([exact_data(q, 100, torch.float32) for q in range(WORLD)], dist.ReduceOp.SUM)
    check(fut[0], want, "async all_reduce future value")
    check(t, want, "async all_reduce tensor")
    # a non-contiguous-free view inside a bigger tensor: in place on the slice
    big = torch.zeros(30, dtype=torch.int32)
    big[10:20] = RANK + 1
    dist.all_reduce(big[10:20])
    assert big[10:20].tolist() == [WORLD * (WORLD + 1) // 2] * 10 and big[:10].abs().sum() == 0


def _allreduce_cuda():
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


def sc_registered():
    """registered_empty + all_reduce (no copy-in), on DEV."""
    (_registered_cuda if DEV.type == "cuda" else _registered_cpu)()


def _registered_cpu():
    """registered_empty + all_reduce (no copy-in), against the reference."""
    init()
    for dtype in DTYPES:
        for op in ops_for(dtype):
            for n in (0, 1, 7, 3000, 70001):
                t = fd.registered_empty((n,), dtype)
                assert fd.get_fastpar_backend().is_registered(t) or n == 0
                xs = [exact_data(q, n, dtype) for q in range(WORLD)]
                t.copy_(xs[RANK])
                dist.all_reduce(t, op=op)
                check(t, reference(xs, op), f"registered all_reduce {dtype} {op} n={n}",
                      exact=op != dist.ReduceOp.AVG)
                del t
    # 2-D, reused after free, and mixed with plain tensors
    keep = [fd.registered_empty((64, 33), torch.float32) for _ in range(3)]
    for i, k in enumerate(keep):
        k.fill_(RANK + i)
        dist.all_reduce(k)
        assert torch.all(k == sum(q + i for q in range(WORLD))), k
    plain = torch.ones(5)
    dist.all_reduce(plain)
    assert torch.all(plain == WORLD)
    # No room on any rank: every rank raises ValueError (the ranks agreed on
    # that), and the group stays usable.
    try:
        fd.registered_empty((1 << 40,), torch.float32)
        raise AssertionError("a registered tensor larger than the arena was allocated")
    except ValueError as e:
        assert "do not fit in the registered arena" in str(e), str(e)
    dist.all_reduce(plain)
    assert torch.all(plain == WORLD * WORLD)
    finish()


def _registered_cuda():
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


def sc_avg_integers():
    """AVG on every integer dtype as NCCL computes it (reference.INT_AVG_CASES:
    hand-worked values with negative sums and sums that wrap), rank q giving
    row q, at sizes that take every schedule: all_reduce, reduce at each root,
    reduce_scatter(_tensor), and a registered buffer."""
    init()
    assert WORLD in (2, 3), "INT_AVG_CASES has the averages of 2 and of 3 contributions"
    for dtype, (rows, avg2, avg3) in INT_AVG_CASES.items():
        want1 = avg2 if WORLD == 2 else avg3
        for reps in (1, 700):  # 3-4 and 2100-2800 elements: one-shot and chunked two-shot
            mine = torch.tensor(rows[RANK] * reps, dtype=dtype)
            want = torch.tensor(want1 * reps, dtype=dtype)
            tag = f"{dtype} n={mine.numel()}"
            t = mine.clone()
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            assert torch.equal(t, want), f"all_reduce AVG {tag}: got {t[:4].tolist()} want {want1}"
            for root in range(WORLD):
                t = mine.clone()
                dist.reduce(t, dst=root, op=dist.ReduceOp.AVG)
                assert torch.equal(t, want if RANK == root else mine), f"reduce AVG root={root} {tag}"
            # reduce_scatter: rank q receives the average of everyone's block q.
            full = torch.cat([mine] * WORLD)
            o = torch.empty_like(mine)
            dist.reduce_scatter_tensor(o, full, op=dist.ReduceOp.AVG)
            assert torch.equal(o, want), f"reduce_scatter_tensor AVG {tag}"
            o = torch.empty_like(mine)
            dist.reduce_scatter(o, [mine] * WORLD, op=dist.ReduceOp.AVG)
            assert torch.equal(o, want), f"reduce_scatter AVG {tag}"
            t = fd.registered_empty((mine.numel(),), dtype)
            t.copy_(mine)
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            assert torch.equal(t, want), f"registered all_reduce AVG {tag}"
            del t
    finish()


def _logical_or_bitwise(op, dtype):
    """The pure-torch fold of `op` over ranks, as gloo computes it: on bool
    SUM and MAX are an or, PRODUCT and MIN an and."""
    if dtype == torch.bool:
        op = {dist.ReduceOp.SUM: dist.ReduceOp.BOR, dist.ReduceOp.MAX: dist.ReduceOp.BOR,
              dist.ReduceOp.PRODUCT: dist.ReduceOp.BAND, dist.ReduceOp.MIN: dist.ReduceOp.BAND}.get(op, op)
    return {dist.ReduceOp.BAND: torch.bitwise_and, dist.ReduceOp.BOR: torch.bitwise_or,
            dist.ReduceOp.BXOR: torch.bitwise_xor}[op]


def sc_bitwise_bool_complex():
    """What gloo reduces beyond the element math's dtypes and ops: BAND, BOR
    and BXOR on every integer dtype; every op but AVG on bool tensors (SUM an
    or, PRODUCT an and); SUM and AVG on complex tensors (their real and
    imaginary parts). At sizes that take both schedules: all_reduce, reduce,
    reduce_scatter_tensor and the direct call, against a fold of the ranks'
    data; and the calls still refused."""
    init()
    bitwise = [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]
    arithmetic = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
    cases = [(dt, bitwise) for dt in (torch.int8, torch.uint8, torch.int32, torch.int64)]
    cases += [(torch.bool, bitwise + arithmetic)]
    cases += [(dt, [dist.ReduceOp.SUM, dist.ReduceOp.AVG]) for dt in (torch.complex64, torch.complex128)]
    for dtype, ops in cases:
        for n in (0, 1, 1000, 300_001):  # 300_001 elements: two-shot for every dtype
            g = torch.Generator().manual_seed(n)
            xs = [torch.randint(0, 256, (WORLD * n, 2), generator=g) for _ in range(WORLD)]
            if dtype == torch.bool:
                xs = [x[:, 0] > 127 for x in xs]
            elif dtype.is_complex:  # small integers: every order sums them to the same bits
                xs = [torch.view_as_complex((x - 128).to(dtype.to_real())) for x in xs]
            else:
                xs = [x[:, 0].to(dtype) * (-3 if dtype.is_signed else 1) for x in xs]
            for op in ops:
                if dtype.is_complex:
                    want = torch.stack([torch.view_as_real(x) for x in xs]).sum(0)
                    want = torch.view_as_complex(want / WORLD if op == dist.ReduceOp.AVG else want)
                else:
                    fold = _logical_or_bitwise(op, dtype)
                    want = xs[0]
                    for x in xs[1:]:
                        want = fold(want, x)
                tag = f"{op} {dtype} n={n}"
                t = xs[RANK][:n].clone()
                dist.all_reduce(t, op=op)
                check(t, want[:n], f"all_reduce {tag}")
                t = xs[RANK][:n].clone()
                fd.all_reduce(t, op=op)
                check(t, want[:n], f"direct all_reduce {tag}")
                t = xs[RANK][:n].clone()
                dist.reduce(t, dst=WORLD - 1, op=op)
                check(t, want[:n] if RANK == WORLD - 1 else xs[RANK][:n], f"reduce {tag}")
                o = torch.empty(n, dtype=dtype)
                dist.reduce_scatter_tensor(o, xs[RANK], op=op)
                check(o, want[RANK * n:(RANK + 1) * n], f"reduce_scatter_tensor {tag}")
    refused = [  # (call, error type, words); dist.reduce: torch's all_reduce checks complex ops itself
        (lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool), op=dist.ReduceOp.AVG), ValueError,
         "torch.bool, which has no mean"),
        (lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND), TypeError,
         "op is ReduceOp.BAND, which reduces integer and bool tensors, but tensors[0] has dtype torch.float32"),
        (lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16)), TypeError,
         "torch.int16, which fastpar does not reduce"),
        (lambda: dist.reduce(torch.ones(3, dtype=torch.complex64), dst=0, op=dist.ReduceOp.MAX), ValueError,
         "op is ReduceOp.MAX but tensors[0] has dtype torch.complex64, which reduces with SUM and AVG only"),
        (lambda: dist.all_reduce(torch.ones(3), op=dist._make_nccl_premul_sum(2.0)), ValueError,
         "op is ReduceOp.PREMUL_SUM, which fastpar does not support"),
    ]
    for call, kind, words in refused:
        try:
            call()
        except kind as e:
            assert words in str(e), f"expected {words!r} in: {e}"
        else:
            raise AssertionError(f"not refused: {words}")
    finish()
