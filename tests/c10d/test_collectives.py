"""Every collective of fastpar's torch.distributed backend against a
reference, in real processes, on each device and world size: on the CPU over
shared memory (a 4 KiB slot makes the larger sizes cross many chunks; both
allreduce schedules run, auto and each one forced); on CUDA tensors
("cpu:fastpar,cuda:fastpar") over CUDA IPC, every op x dtype below
(bitwise, in rank order) and above the IPC threshold, the route each call
took. The CUDA shapes skip without a GPU (and in CPU-only builds).
Batched: one launch per shape (batched_scenarios.py). What only the CUDA
path has (small IPC slots, graphs, streams, the IPC state): test_cuda_ipc.py."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import fastpar
import fastpar.distributed as fd
from fastpar._C import _testing
from batched_scenarios import REGISTERED, InBatch, assert_scenario_ok, batched, scenario_result, shapes
from dist_harness import assert_ok, scenario
from reference import DTYPES, FLOATS, INT_AVG_CASES, bitwise_fold, exact_data, in_rank_order, random_data, reference
from worker_context import (ARGS, DEV, MAX_IPC, RANK, SHARED, WORLD, check, check_equal, cuda_backend, finish, init,
                            ops_for, peer_access_everywhere, same_bits_everywhere)

pytestmark = pytest.mark.usefixtures("no_leftover_segments")


@scenario
def sc_allreduce():
    """all_reduce for every dtype, op and size, on DEV."""
    (_allreduce_cuda if DEV.type == "cuda" else _allreduce_cpu)()


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2, 3, 4]))
@batched(sc_allreduce)
def test_all_reduce_every_op_dtype_and_size(request, device, layout, world):
    assert_scenario_ok(scenario_result(request), device, "allreduce")


@scenario
def sc_allreduce_forced():
    """CPU all_reduce with the schedule ARGS[0] ("one_shot" or "two_shot")
    forced for the sizes that allow it."""
    init()
    _testing.set_shm_allreduce(fd.get_fastpar_backend(), -1, {"one_shot": 1, "two_shot": 2}[ARGS[0]])
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


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2], cuda_layouts=[]))
@pytest.mark.parametrize("schedule", ["one_shot", "two_shot"])
@batched(lambda p: InBatch(sc_allreduce_forced, [p["schedule"]]))
def test_all_reduce_with_each_schedule_forced(request, device, layout, world, schedule):
    assert_ok(scenario_result(request))


@scenario
def sc_collectives():
    """Every other collective against a reference, on DEV."""
    (_collectives_cuda if DEV.type == "cuda" else _collectives_cpu)()


def _collectives_cpu():
    """Every other collective against a pure-torch reference."""
    init()
    sizes = [0, 1, 7, 1000, 5003]
    for dtype in DTYPES:
        for n in sizes:
            xs = [exact_data(q, n, dtype) for q in range(WORLD)]
            tag = f"{dtype} n={n}"
            for root in range(WORLD):
                t = xs[RANK].clone()
                dist.broadcast(t, src=root)
                check(t, xs[root], f"broadcast root={root} {tag}")
            out = [torch.full((n,), 9, dtype=dtype) for _ in range(WORLD)]
            dist.all_gather(out, xs[RANK])
            for q in range(WORLD):
                check(out[q], xs[q], f"all_gather [{q}] {tag}")
            flat = torch.empty(WORLD * n, dtype=dtype)
            dist.all_gather_into_tensor(flat, xs[RANK])
            check(flat, torch.cat(xs), f"all_gather_into_tensor {tag}")
            root = WORLD - 1
            g = [torch.empty(n, dtype=dtype) for _ in range(WORLD)] if RANK == root else None
            dist.gather(xs[RANK], g, dst=root)
            if RANK == root:
                for q in range(WORLD):
                    check(g[q], xs[q], f"gather [{q}] {tag}")
            chunks = [exact_data(q, n, dtype, seed=11) for q in range(WORLD)]
            o = torch.empty(n, dtype=dtype)
            dist.scatter(o, chunks if RANK == 0 else None, src=0)
            check(o, chunks[RANK], f"scatter {tag}")
            # all_to_all (lists) and all_to_all_single (even and uneven)
            ins = [exact_data(RANK * WORLD + q, n + q, dtype) for q in range(WORLD)]
            outs = [torch.empty(n + RANK, dtype=dtype) for _ in range(WORLD)]
            dist.all_to_all(outs, ins)
            for q in range(WORLD):
                check(outs[q], exact_data(q * WORLD + RANK, n + RANK, dtype), f"all_to_all from {q} {tag}")
            src = torch.cat([exact_data(RANK * WORLD + q, n, dtype) for q in range(WORLD)])
            dst = torch.empty_like(src)
            dist.all_to_all_single(dst, src)
            check(dst, torch.cat([exact_data(q * WORLD + RANK, n, dtype) for q in range(WORLD)]), f"all_to_all_single {tag}")
            in_split = [n + q + RANK for q in range(WORLD)]
            out_split = [n + RANK + q for q in range(WORLD)]
            src = torch.cat([exact_data(RANK * 31 + q, in_split[q], dtype) for q in range(WORLD)])
            dst = torch.empty(sum(out_split), dtype=dtype)
            dist.all_to_all_single(dst, src, out_split, in_split)
            want = torch.cat([exact_data(q * 31 + RANK, out_split[q], dtype) for q in range(WORLD)])
            check(dst, want, f"all_to_all_single uneven {tag}")
            for op in ops_for(dtype):
                exact = op != dist.ReduceOp.AVG
                full = [exact_data(q, WORLD * n, dtype, seed=5) for q in range(WORLD)]
                ref = reference(full, op)
                o = torch.empty(n, dtype=dtype)
                dist.reduce_scatter_tensor(o, full[RANK], op=op)
                check(o, ref[RANK * n:(RANK + 1) * n], f"reduce_scatter_tensor {op} {tag}", exact)
                o2 = torch.empty(n, dtype=dtype)
                dist.reduce_scatter(o2, list(full[RANK].chunk(WORLD)) if n else [torch.empty(0, dtype=dtype)] * WORLD,
                                    op=op)
                check(o2, ref[RANK * n:(RANK + 1) * n], f"reduce_scatter {op} {tag}", exact)
                for root in (0, WORLD - 1):
                    t = xs[RANK].clone()
                    dist.reduce(t, dst=root, op=op)
                    if RANK == root:
                        check(t, reference(xs, op), f"reduce root={root} {op} {tag}", exact)
                    else:
                        check(t, xs[RANK], f"reduce leaves non-root input alone {op} {tag}")
    for _ in range(3):
        dist.barrier()
    work = dist.broadcast(torch.zeros(3), src=0, async_op=True)
    work.wait()
    assert work.get_future().done()
    finish()


def _collectives_cuda():
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


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2, 3]))
@batched(sc_collectives)
def test_every_collective_every_dtype_and_op(request, device, layout, world):
    assert_scenario_ok(scenario_result(request), device, "collectives")


@scenario
def sc_registered():
    """registered_empty + all_reduce (no copy-in), on DEV."""
    (_registered_cuda if DEV.type == "cuda" else _registered_cpu)()


def _all_reduce_counting_zero_copy(t: torch.Tensor, op=dist.ReduceOp.SUM) -> int:
    """dist.all_reduce(t, op); how many calls took the zero-copy schedule of
    registered buffers (0 or 1): its results equal the copying schedules', so
    only the backend's count tells them apart."""
    before = fastpar._C._shm_registered_allreduce_calls()
    dist.all_reduce(t, op=op)
    return fastpar._C._shm_registered_allreduce_calls() - before


def _registered_cpu():
    """registered_empty + all_reduce without the copy-in, against the
    reference. The launch (batched_scenarios.SMALL_SLOT) sends registered
    buffers of every size to the zero-copy schedule where the copying one
    would run two-shot: every buffer larger than a slot. That is their near
    form; their far form is the copying two-shot's (shm_placement.h), with
    the same bits."""
    init()
    b = fd.get_fastpar_backend()
    slot = int(os.environ["FASTPAR_SHM_SLOT_BYTES"])
    for dtype in DTYPES:
        for op in ops_for(dtype):
            for n in (0, 1, 7, 3000, 70001):
                t = fd.registered_empty((n,), dtype)
                assert b.is_registered(t) or n == 0
                xs = [exact_data(q, n, dtype) for q in range(WORLD)]
                got = {}
                for form in ("near", "far"):
                    _testing.set_shm_placement(b, form)
                    t.copy_(xs[RANK])
                    zero_copy = _all_reduce_counting_zero_copy(t, op)
                    what = f"registered all_reduce {dtype} {op} n={n}, {form}"
                    check(t, reference(xs, op), what, exact=op != dist.ReduceOp.AVG)
                    if n * t.element_size() > slot:
                        assert zero_copy == (form == "near"), f"{what}: {t.nbytes} bytes, zero-copy {zero_copy}"
                    got[form] = t.clone()
                assert torch.equal(got["near"], got["far"]), f"registered all_reduce {dtype} {op} n={n}: near != far"
                del t
    _testing.set_shm_placement(b, "near")
    # 2-D, reused after free, and mixed with plain tensors (which never take it)
    keep = [fd.registered_empty((64, 33), torch.float32) for _ in range(3)]
    for i, k in enumerate(keep):
        k.fill_(RANK + i)
        assert _all_reduce_counting_zero_copy(k) == 1, f"registered 64x33 buffer {i}: not the zero-copy schedule"
        assert torch.all(k == sum(q + i for q in range(WORLD))), k
    plain = torch.ones(5)
    assert _all_reduce_counting_zero_copy(plain) == 0, "a plain tensor took the zero-copy schedule"
    assert torch.all(plain == WORLD)
    big_plain = torch.ones(70001)
    assert _all_reduce_counting_zero_copy(big_plain) == 0, "a plain tensor took the zero-copy schedule"
    assert torch.all(big_plain == WORLD)
    _testing.set_shm_placement(b, "auto")
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
            # the plain side's two-shot in either form (FASTPAR_CUDA_IPC_TWO_SHOT)
            assert "registered offset=" in msg and ("schedule=two_shot" in msg or "schedule=fused_two_shot" in msg), msg
    torch.cuda.synchronize()
    dist.destroy_process_group()
    print(f"registered rank {RANK} ok", flush=True)


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2, 3, 4]))
@batched(lambda p: InBatch(sc_registered, env=REGISTERED if p["device"] == "cuda" else {}))
def test_registered_buffers_all_reduce_without_copy_in(request, device, layout, world):
    assert_scenario_ok(scenario_result(request), device, "registered")


@scenario
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


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2, 3], cuda_layouts=[]))
@batched(sc_avg_integers)
def test_avg_of_integers_as_nccl_computes_it(request, device, layout, world):
    assert_ok(scenario_result(request))


@scenario
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
                    fold = bitwise_fold(op, dtype)
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


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2, 3], cuda_layouts=[]))
@batched(sc_bitwise_bool_complex)
def test_bitwise_ops_bool_and_complex_tensors_as_gloo_reduces_them(request, device, layout, world):
    assert_ok(scenario_result(request))


@scenario
def sc_strided():
    """CPU tensors that are not contiguous (channels_last, transposed, a
    strided slice), as gloo takes them, in every collective: the results are
    those of contiguous tensors, written into the caller's tensor, and a
    slice's neighbours are left alone."""
    init()
    W, r = WORLD, RANK
    n = 48 * W
    xs = [exact_data(q, n, torch.float32) for q in range(W)]
    rows = lambda x, c: x.reshape(-1, c).t().contiguous().t()  # noqa: E731  (x as c columns, column-major)
    empty_rows = lambda k, c: torch.zeros(c, k).t()  # noqa: E731  (k x c, column-major)
    layouts = {
        "channels_last": lambda x: x.reshape(2, 3, 4, -1).contiguous(memory_format=torch.channels_last),
        "transposed": lambda x: rows(x, 6),
        "slice": lambda x: torch.stack([x, torch.full_like(x, -7.0)], 1)[:, 0],
    }
    for name, lay in layouts.items():
        mine = lay(xs[r].clone())
        assert not mine.is_contiguous(), name
        dist.all_reduce(mine)
        check(mine.flatten(), sum(xs), f"all_reduce {name}")
        if name == "slice":
            assert torch.all(mine._base[:, 1] == -7.0), "all_reduce wrote a slice's neighbours"
        mine = lay(xs[r].clone())
        dist.broadcast(mine, src=W - 1)
        check(mine.flatten(), xs[W - 1], f"broadcast {name}")
        mine = lay(xs[r].clone())
        dist.reduce(mine, dst=0)
        check(mine.flatten(), sum(xs) if r == 0 else xs[r], f"reduce {name}")
        gl = [torch.zeros(n) for _ in range(W)] if r == 0 else None
        dist.gather(lay(xs[r].clone()), gl, dst=0)
        for q in range(W if r == 0 else 0):
            check(gl[q], xs[q], f"gather [{q}] {name}")
    # The flat and list forms, strided inputs and outputs (2 columns, column-major).
    out = empty_rows(n // 2 * W, 2)
    dist.all_gather_into_tensor(out, rows(xs[r], 2))
    check(out, torch.cat([rows(x, 2) for x in xs]), "all_gather_into_tensor")
    outs = [empty_rows(n // 2, 2) for _ in range(W)]
    dist.all_gather(outs, rows(xs[r], 2))
    for q in range(W):
        check(outs[q], xs[q].reshape(-1, 2), f"all_gather [{q}]")
    out = empty_rows(n // 2 // W, 2)
    dist.reduce_scatter_tensor(out, rows(xs[r], 2))
    k = n // 2 // W
    check(out, sum(xs).reshape(-1, 2)[r * k:(r + 1) * k], "reduce_scatter_tensor")
    out = empty_rows(n // 2, 2)
    dist.all_to_all_single(out, rows(xs[r], 2))
    check(out, torch.cat([xs[q].reshape(-1, 2)[r * k:(r + 1) * k] for q in range(W)]), "all_to_all_single")
    out = empty_rows(n // 2, 2)
    dist.scatter(out, [rows(x, 2) for x in xs] if r == 0 else None, src=0)
    check(out, xs[r].reshape(-1, 2), "scatter")
    gl = [empty_rows(n // 2, 2) for _ in range(W)] if r == 0 else None
    dist.gather(rows(xs[r], 2), gl, dst=0)
    for q in range(W if r == 0 else 0):
        check(gl[q], xs[q].reshape(-1, 2), f"gather [{q}]")
    outs = [[empty_rows(n // 2, 2), empty_rows(3, 2)] for _ in range(W)]
    dist.all_gather_coalesced(outs, [rows(xs[r], 2), rows(xs[r][:6], 2)])
    for q in range(W):
        check(outs[q][0], xs[q].reshape(-1, 2), f"all_gather_coalesced [{q}][0]")
        check(outs[q][1], xs[q][:6].reshape(-1, 2), f"all_gather_coalesced [{q}][1]")
    # and the direct call
    t = rows(xs[r], 4)
    fd.all_reduce(t)
    check(t, sum(xs).reshape(-1, 4), "fastpar.distributed.all_reduce, transposed")
    finish()


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2, 3], cuda_layouts=[]))
@batched(sc_strided)
def test_cpu_tensors_with_any_strides_as_gloo_takes_them(request, device, layout, world):
    assert_ok(scenario_result(request))


@scenario
def sc_bad_input():
    """Mistakes are caught before any work, with argument, index and values;
    the communicator stays usable afterwards."""
    init()
    errors = []

    def expect(fn, *fragments):
        try:
            fn()
        except (ValueError, TypeError, RuntimeError) as e:
            msg = str(e)
            for f in fragments:
                assert f in msg, f"expected {f!r} in: {msg}"
            errors.append(msg)
            return
        raise AssertionError(f"no error; expected {fragments}")

    expect(lambda: dist.send(torch.ones(4, 4).t(), (RANK + 1) % WORLD), "fastpar.send: tensors[0] must be contiguous",
           "strides")
    expect(lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16)), "tensors[0] has dtype torch.int16",
           "which fastpar does not reduce")
    expect(lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND), "op is ReduceOp.BAND",
           "reduces integer and bool tensors")
    expect(lambda: dist.all_gather([torch.ones(3)] * (WORLD + 1), torch.ones(3)),
           f"output_tensors[0] has {WORLD + 1} tensors but the group has {WORLD} ranks")
    expect(lambda: dist.all_gather([torch.ones(3)] * (WORLD - 1) + [torch.ones(4)], torch.ones(3)),
           f"output_tensors[0][{WORLD - 1}] has 4 elements but 3 were expected")
    expect(lambda: dist.all_gather_into_tensor(torch.empty(WORLD * 3 + 1), torch.ones(3)),
           f"output_tensor has {WORLD * 3 + 1} elements but {WORLD * 3} were expected")
    expect(lambda: dist.reduce_scatter_tensor(torch.empty(3), torch.ones(WORLD * 3 - 1)),
           f"input has {WORLD * 3 - 1} elements but {WORLD * 3} were expected")
    expect(lambda: dist.all_to_all_single(torch.empty(WORLD + 1), torch.ones(WORLD + 1)),
           f"has {WORLD + 1} rows, which do not split evenly over {WORLD} ranks")
    expect(lambda: fd.registered_empty((-1,), torch.float32), "shape[0] is -1")
    expect(lambda: fd.registered_empty((3,), torch.float32, device="meta"),
           "fastpar.registered_empty: device is 'meta' but registered tensors are CPU or CUDA")
    no_cuda_backend = fd.get_fastpar_backend().cuda_engine is None
    if no_cuda_backend:
        expect(lambda: fd.registered_empty((3,), torch.float32, device="cuda"),
               "device is 'cuda' but this group has no fastpar CUDA backend")
    # gather's / scatter's per-rank lists: the root passes one tensor per rank
    # (every rank is the root of its own call here), the others none.
    three = torch.ones(3)
    expect(lambda: dist.gather(three, [torch.empty(3)] * (WORLD + 1), dst=RANK),
           f"fastpar.gather: output_tensors[0] has {WORLD + 1} tensors but the group has {WORLD} ranks")
    expect(lambda: dist.scatter(torch.empty(3), [three] * (WORLD - 1), src=RANK),
           f"fastpar.scatter: input_tensors[0] has {WORLD - 1} tensors but the group has {WORLD} ranks")
    be, other = fd.get_fastpar_backend(), (RANK + 1) % WORLD
    gopts, sopts = dist.GatherOptions(), dist.ScatterOptions()
    gopts.rootRank = sopts.rootRank = other
    expect(lambda: be.gather([[torch.empty(3)] * WORLD], [three], gopts),
           f"fastpar.gather: rank {RANK} is not the root ({other}) and must pass no output_tensors, got 1 lists")
    expect(lambda: be.scatter([torch.empty(3)], [[three] * WORLD], sopts),
           f"fastpar.scatter: rank {RANK} is not the root ({other}) and must pass no input_tensors, got 1 lists")
    assert len(errors) == 14 + no_cuda_backend
    t = torch.full((5,), float(RANK))
    dist.all_reduce(t)
    assert torch.all(t == sum(range(WORLD)))
    print("\n".join(errors))
    finish()


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2], cuda_layouts=[]))
@batched(sc_bad_input)
def test_bad_input_is_refused_before_any_work(request, device, layout, world):
    results = scenario_result(request)
    assert_ok(results)
    assert "fastpar.send: tensors[0] must be contiguous" in results[0].out, results[0].out
