"""Scenarios run by the distributed tests, one process per rank:

    python dist_worker.py SCENARIO RANK WORLD PORT [ARGS...]

Each scenario asserts on its own results (a failed assert exits non-zero with
the traceback on stderr); the pytest side checks exit codes and messages."""
from __future__ import annotations

import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import fastpar  # registers the "fastpar" backend
import fastpar.distributed as fd
from reference import INT_AVG_CASES

SCENARIO, RANK, WORLD, PORT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ARGS = sys.argv[5:]
TIMEOUT_S = float(os.environ.get("FASTPAR_TEST_TIMEOUT_S", "10"))

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32, torch.int64]
FLOATS = {torch.float32, torch.float64, torch.float16, torch.bfloat16}
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]


_IN_SUITE = False


def init(timeout_s: float = TIMEOUT_S, backend: str = "fastpar"):
    if _IN_SUITE and dist.is_initialized():
        return None
    store = dist.TCPStore("127.0.0.1", PORT, WORLD, RANK == 0, timeout=datetime.timedelta(seconds=30),
                          wait_for_workers=False)
    dist.init_process_group(backend, store=store, rank=RANK, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return store


def finish():
    if not _IN_SUITE:
        dist.destroy_process_group()


def data(rank: int, count: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Small exact integers (-2..2, or 0..4 unsigned): sums and products of up
    to 8 ranks are exact in every dtype (or wrap identically for integers)."""
    v = (torch.arange(count, dtype=torch.int64) * 7 + rank * 3 + salt) % 5
    if dtype != torch.uint8:
        v = v - 2
    return v.to(dtype)


def reference(xs: list[torch.Tensor], op, dtype: torch.dtype) -> torch.Tensor:
    wide = torch.float64 if dtype in FLOATS else torch.int64
    s = torch.stack([x.to(wide) for x in xs])
    if op == dist.ReduceOp.SUM:
        r = s.sum(0)
    elif op == dist.ReduceOp.AVG and dtype in FLOATS:
        r = s.sum(0) / len(xs)
    elif op == dist.ReduceOp.AVG:  # NCCL's: the wrapped sum, divided truncating toward zero
        return torch.div(reference(xs, dist.ReduceOp.SUM, dtype).to(torch.int64), len(xs),
                         rounding_mode="trunc").to(dtype)
    elif op == dist.ReduceOp.PRODUCT:
        r = s.prod(0)
    elif op == dist.ReduceOp.MIN:
        r = s.min(0).values
    else:
        r = s.max(0).values
    return r.to(dtype)


def check(got: torch.Tensor, want: torch.Tensor, what: str, exact: bool = True):
    """`exact=False` allows float rounding; integer results are always exact."""
    if exact or not got.is_floating_point():
        assert torch.equal(got, want), f"{what}: got {got[:8]} want {want[:8]}"
    else:
        torch.testing.assert_close(got, want, msg=lambda m: f"{what}: {m}")


def same_bits_everywhere(t: torch.Tensor, what: str):
    b = t.contiguous().view(torch.uint8).flatten() if t.numel() else torch.zeros(0, dtype=torch.uint8)
    gathered = [torch.empty_like(b) for _ in range(WORLD)]
    dist.all_gather(gathered, b)
    for q in range(WORLD):
        assert torch.equal(gathered[q], b), f"{what}: rank {q} has different bits than rank {RANK}"


def ops_for(dtype):
    return OPS


# ---------------------------------------------------------------- scenarios


def sc_allreduce(sizes=(0, 1, 7, 1000, 5003)):
    """all_reduce for every dtype, op and size (0, 1, odd, < slot, > slot)."""
    init()
    for dtype in DTYPES:
        for op in ops_for(dtype):
            for n in sizes:
                xs = [data(q, n, dtype) for q in range(WORLD)]
                t = xs[RANK].clone()
                dist.all_reduce(t, op=op)
                what = f"all_reduce {dtype} {op} n={n}"
                check(t, reference(xs, op, dtype), what, exact=op != dist.ReduceOp.AVG)
                if op == dist.ReduceOp.AVG:
                    same_bits_everywhere(t, what)
    # async: wait() and get_future() as torch's
    t = data(RANK, 100, torch.float32)
    work = dist.all_reduce(t, async_op=True)
    assert work.wait() is True
    assert work.is_completed()
    fut = work.get_future().wait()
    want = reference([data(q, 100, torch.float32) for q in range(WORLD)], dist.ReduceOp.SUM, torch.float32)
    check(fut[0], want, "async all_reduce future value")
    check(t, want, "async all_reduce tensor")
    # a non-contiguous-free view inside a bigger tensor: in place on the slice
    big = torch.zeros(30, dtype=torch.int32)
    big[10:20] = RANK + 1
    dist.all_reduce(big[10:20])
    assert big[10:20].tolist() == [WORLD * (WORLD + 1) // 2] * 10 and big[:10].abs().sum() == 0
    finish()


def sc_collectives():
    """Every other collective against a pure-torch reference."""
    init()
    sizes = [0, 1, 7, 1000, 5003]
    for dtype in DTYPES:
        for n in sizes:
            xs = [data(q, n, dtype) for q in range(WORLD)]
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
            chunks = [data(q, n, dtype, salt=11) for q in range(WORLD)]
            o = torch.empty(n, dtype=dtype)
            dist.scatter(o, chunks if RANK == 0 else None, src=0)
            check(o, chunks[RANK], f"scatter {tag}")
            # all_to_all (lists) and all_to_all_single (even and uneven)
            ins = [data(RANK * WORLD + q, n + q, dtype) for q in range(WORLD)]
            outs = [torch.empty(n + RANK, dtype=dtype) for _ in range(WORLD)]
            dist.all_to_all(outs, ins)
            for q in range(WORLD):
                check(outs[q], data(q * WORLD + RANK, n + RANK, dtype), f"all_to_all from {q} {tag}")
            src = torch.cat([data(RANK * WORLD + q, n, dtype) for q in range(WORLD)])
            dst = torch.empty_like(src)
            dist.all_to_all_single(dst, src)
            check(dst, torch.cat([data(q * WORLD + RANK, n, dtype) for q in range(WORLD)]), f"all_to_all_single {tag}")
            in_split = [n + q + RANK for q in range(WORLD)]
            out_split = [n + RANK + q for q in range(WORLD)]
            src = torch.cat([data(RANK * 31 + q, in_split[q], dtype) for q in range(WORLD)])
            dst = torch.empty(sum(out_split), dtype=dtype)
            dist.all_to_all_single(dst, src, out_split, in_split)
            want = torch.cat([data(q * 31 + RANK, out_split[q], dtype) for q in range(WORLD)])
            check(dst, want, f"all_to_all_single uneven {tag}")
            for op in ops_for(dtype):
                exact = op != dist.ReduceOp.AVG
                full = [data(q, WORLD * n, dtype, salt=5) for q in range(WORLD)]
                ref = reference(full, op, dtype)
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
                        check(t, reference(xs, op, dtype), f"reduce root={root} {op} {tag}", exact)
                    else:
                        check(t, xs[RANK], f"reduce leaves non-root input alone {op} {tag}")
    for _ in range(3):
        dist.barrier()
    work = dist.broadcast(torch.zeros(3), src=0, async_op=True)
    work.wait()
    assert work.get_future().done()
    finish()


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


def sc_registered():
    """registered_empty + all_reduce (no copy-in), against the reference."""
    init()
    for dtype in DTYPES:
        for op in ops_for(dtype):
            for n in (0, 1, 7, 3000, 70001):
                t = fd.registered_empty((n,), dtype)
                assert fd.get_fastpar_backend().is_registered(t) or n == 0
                xs = [data(q, n, dtype) for q in range(WORLD)]
                t.copy_(xs[RANK])
                dist.all_reduce(t, op=op)
                check(t, reference(xs, op, dtype), f"registered all_reduce {dtype} {op} n={n}",
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

    expect(lambda: dist.all_reduce(torch.ones(4, 4).t()), "fastpar.all_reduce: tensors[0] must be contiguous",
           "strides")
    expect(lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool)), "tensors[0] has dtype torch.bool", "which fastpar does not support")
    expect(lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND), "is not supported")
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


def sc_mismatch():
    """Ranks that call different collectives, sizes, dtypes or splits get an
    error that says so. Each case runs in a fresh fastpar group (a failed
    communicator stays failed), and the world group must survive them all."""
    init()
    for kind in ARGS:
        g = dist.new_group(backend="fastpar")
        try:
            if kind == "op":
                if RANK == 0:
                    dist.all_reduce(torch.ones(10), group=g)
                else:
                    dist.broadcast(torch.ones(10), src=0, group=g)
            elif kind == "size":
                dist.all_reduce(torch.ones(10 + RANK), group=g)
            elif kind == "dtype":
                dist.all_reduce(torch.ones(10, dtype=torch.float32 if RANK == 0 else torch.float64), group=g)
            elif kind == "split":
                # Each rank's splits are consistent with themselves (its block to
                # itself agrees), but ranks >= 1 send rank 0 one row where it expects two.
                splits = [2] * WORLD if RANK == 0 else [1] + [2] * (WORLD - 2) + [3]
                dist.all_to_all_single(torch.empty(2 * WORLD), torch.ones(2 * WORLD), splits, splits, group=g)
        except dist.DistBackendError as e:
            print(f"{kind}: ERROR: {e}", flush=True)
            try:
                dist.all_reduce(torch.ones(1), group=g)
                raise AssertionError("a failed communicator accepted another collective")
            except dist.DistBackendError as again:
                assert "unusable after an earlier error" in str(again), again
            continue
        raise AssertionError(f"{kind}: no error")
    t = torch.ones(3)
    dist.all_reduce(t)
    assert torch.all(t == WORLD)
    dist.destroy_process_group()


def sc_missing_peer():
    """Rank WORLD-1 never starts; the others must fail within the timeout."""
    t0 = time.monotonic()
    try:
        init(timeout_s=float(ARGS[0]))
    except Exception as e:  # noqa: BLE001  the type is DistBackendError; print it for the test
        print(f"ERROR after {time.monotonic() - t0:.1f}s: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(3)
    sys.exit(0)


def sc_absent_in_collective():
    """Everyone joins; the last rank then never calls all_reduce."""
    init(timeout_s=float(ARGS[0]))
    dist.barrier()
    if RANK == WORLD - 1:
        time.sleep(float(ARGS[0]) * 3)
        sys.exit(0)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(10))
    except dist.DistBackendError as e:
        print(f"ERROR after {time.monotonic() - t0:.1f}s: {e}", file=sys.stderr)
        sys.exit(3)
    sys.exit(0)


def sc_sigkill():
    """Rank ARGS[1] SIGKILLs itself in the middle of a stream of all_reduces; the
    others must fail fast (liveness), well within the long timeout."""
    init(timeout_s=float(ARGS[0]))
    victim = int(ARGS[1])
    t = torch.ones(100000)
    for i in range(20):
        if RANK == victim and i == 10:
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.monotonic()
        try:
            dist.all_reduce(t)
        except dist.DistBackendError as e:
            print(f"ERROR after {time.monotonic() - t0:.1f}s: {e}", file=sys.stderr)
            sys.exit(3)
    sys.exit(0)


def sc_exception_exit():
    """A rank raises (uncaught) after a few collectives: segments must be gone anyway."""
    init()
    t = torch.ones(10)
    dist.all_reduce(t)
    if RANK == 0:
        raise RuntimeError("user code failed on purpose")
    sys.exit(0)


def sc_job_value():
    """One of two simultaneous jobs: allreduce a job-specific value many times."""
    init()
    base = float(ARGS[0])
    for i in range(200):
        t = torch.full((1000,), base + RANK)
        dist.all_reduce(t)
        want = sum(base + q for q in range(WORLD))
        assert torch.all(t == want), f"job {base} iteration {i}: got {t[0].item()} want {want}"
    dist.destroy_process_group()


def sc_hierarchical():
    """FASTPAR_HOST_ID fakes hosts: shm inside, gloo between leaders."""
    init()
    backend = fd.get_fastpar_backend()
    assert backend.hierarchical, "expected the hierarchical path with several FASTPAR_HOST_IDs"
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16):
        for op in ops_for(dtype):
            for n in (0, 1, 7, 5003):
                xs = [data(q, n, dtype) for q in range(WORLD)]
                t = xs[RANK].clone()
                dist.all_reduce(t, op=op)
                check(t, reference(xs, op, dtype), f"hierarchical all_reduce {dtype} {op} n={n}",
                      exact=op != dist.ReduceOp.AVG)
    xs = [data(q, 33, torch.float32) for q in range(WORLD)]
    t = xs[RANK].clone()
    dist.broadcast(t, src=WORLD - 1)
    check(t, xs[WORLD - 1], "hierarchical broadcast")
    out = [torch.empty(33) for _ in range(WORLD)]
    dist.all_gather(out, xs[RANK])
    for q in range(WORLD):
        check(out[q], xs[q], f"hierarchical all_gather [{q}]")
    dist.barrier()
    if ARGS:  # every other collective, on this layout and the layouts named in ARGS
        hier_collectives(dist.group.WORLD, os.environ["FASTPAR_HOST_ID"])
        for spec in ARGS:  # "ranks:hosts", e.g. "0,1,2:AAB"
            ranks, layout = spec.split(":")
            hier_collectives_in_new_group([int(r) for r in ranks.split(",")], layout)
    dist.destroy_process_group()


def hier_collectives_in_new_group(ranks: list[int], layout: str):
    """A fastpar group over `ranks` whose rank i lives on host layout[i]
    (FASTPAR_HOST_ID is read when the group is created)."""
    saved = os.environ["FASTPAR_HOST_ID"]
    if RANK in ranks:
        os.environ["FASTPAR_HOST_ID"] = "host" + layout[ranks.index(RANK)]
    g = dist.new_group(ranks, backend="fastpar")
    if RANK in ranks:
        fd.get_fastpar_backend(g)  # created now, with this rank's host id
        hier_collectives(g, os.environ["FASTPAR_HOST_ID"])
    os.environ["FASTPAR_HOST_ID"] = saved
    dist.barrier()


def hier_collectives(g, host: str, be=None):
    """broadcast, reduce, all_gather(_into_tensor), reduce_scatter(_tensor) on
    a multi-host group against a reference built from every rank's input, each
    call checked to have run a hierarchical schedule (the counter of `be`, by
    default the group's fastpar backend), and gather / scatter / all_to_all
    (world gloo) for correctness."""
    be = be if be is not None else fd.get_fastpar_backend(g)
    n_ranks, me = dist.get_world_size(g), dist.get_rank(g)
    glob = lambda r: dist.get_global_rank(g, r)  # noqa: E731  (src/dst take global ranks)
    assert getattr(be, "hierarchical", True), f"{host}: expected several hosts"
    calls = [be.hierarchical_calls]

    def hier(what):
        calls.append(be.hierarchical_calls)
        assert calls[-1] == calls[-2] + 1, f"{what}: ran {calls[-1] - calls[-2]} hierarchical schedules, expected 1"

    SUM, AVG, MAX = dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX
    for dtype in (torch.float32, torch.float16, torch.int32):
        ops = [SUM, MAX, AVG]
        for n in (0, 1, 7, 5003):
            tag = f"[{host} rank {me}/{n_ranks}] {dtype} n={n}"
            xs = [data(q, n, dtype) for q in range(n_ranks)]
            for root in range(n_ranks):
                t = xs[me].clone()
                dist.broadcast(t, src=glob(root), group=g)
                hier(f"broadcast {tag}")
                check(t, xs[root], f"broadcast root={root} {tag}")
            for op in ops:
                exact = op != AVG
                for root in sorted({0, 1, n_ranks - 1}):
                    t = xs[me].clone()
                    dist.reduce(t, dst=glob(root), op=op, group=g)
                    hier(f"reduce {tag}")
                    if me == root:
                        check(t, reference(xs, op, dtype), f"reduce root={root} {op} {tag}", exact)
                    else:
                        check(t, xs[me], f"reduce leaves non-root input alone root={root} {op} {tag}")
                full = [data(q, n_ranks * n, dtype, salt=5) for q in range(n_ranks)]
                ref = reference(full, op, dtype)[me * n:(me + 1) * n]
                o = torch.full((n,), 9, dtype=dtype)
                dist.reduce_scatter_tensor(o, full[me], op=op, group=g)
                hier(f"reduce_scatter_tensor {tag}")
                check(o, ref, f"reduce_scatter_tensor {op} {tag}", exact)
                o = torch.full((n,), 9, dtype=dtype)
                dist.reduce_scatter(o, list(full[me].chunk(n_ranks)) if n else [torch.empty(0, dtype=dtype)] * n_ranks,
                                    op=op, group=g)
                hier(f"reduce_scatter {tag}")
                check(o, ref, f"reduce_scatter {op} {tag}", exact)
            out = [torch.full((n,), 9, dtype=dtype) for _ in range(n_ranks)]
            dist.all_gather(out, xs[me], group=g)
            hier(f"all_gather {tag}")
            for q in range(n_ranks):
                check(out[q], xs[q], f"all_gather [{q}] {tag}")
            flat = torch.full((n_ranks * n,), 9, dtype=dtype)
            dist.all_gather_into_tensor(flat, xs[me], group=g)
            hier(f"all_gather_into_tensor {tag}")
            check(flat, torch.cat(xs), f"all_gather_into_tensor {tag}")
    # 2-D tensors, bfloat16, and the collectives that stay on world gloo
    x = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3) + me
    out = torch.empty(2 * n_ranks, 3, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(out, x, group=g)
    hier("all_gather_into_tensor 2-D")
    check(out, torch.cat([torch.arange(6, dtype=torch.bfloat16).reshape(2, 3) + q for q in range(n_ranks)]), "2-D")
    before = be.hierarchical_calls
    xs = [data(q, 33, torch.float32) for q in range(n_ranks)]
    gl = [torch.empty(33) for _ in range(n_ranks)] if me == n_ranks - 1 else None
    dist.gather(xs[me], gl, dst=glob(n_ranks - 1), group=g)
    if gl is not None:
        for q in range(n_ranks):
            check(gl[q], xs[q], f"gather [{q}] {host}")
    o = torch.empty(33)
    dist.scatter(o, xs if me == 1 else None, src=glob(1), group=g)
    check(o, xs[me], f"scatter {host}")
    outs = [torch.empty(5) for _ in range(n_ranks)]
    dist.all_to_all(outs, [data(me * n_ranks + q, 5, torch.float32) for q in range(n_ranks)], group=g)
    for q in range(n_ranks):
        check(outs[q], data(q * n_ranks + me, 5, torch.float32), f"all_to_all from {q} {host}")
    assert be.hierarchical_calls == before, "gather/scatter/all_to_all are expected on world gloo"
    print(f"hierarchical collectives ok: {host} rank {me} of {n_ranks}, {be.hierarchical_calls} hierarchical calls",
          flush=True)


def sc_composed_hierarchical():
    """fastpar._C.HierarchicalEngine (the CUDA path's composition on several
    hosts) over CPU stand-ins: a fastpar group per fake host as `local`, gloo
    among the leaders and over the world; one group per layout in ARGS
    ("AABB": ranks 0,1 on host A, 2,3 on B), through torch.distributed."""
    init()
    for layout in ARGS:
        hosts = list(dict.fromkeys(layout))
        host_of = [hosts.index(c) for c in layout]
        local = None
        for h in range(len(hosts)):  # new_group is collective: every rank creates every host's group
            g = dist.new_group([r for r in range(WORLD) if host_of[r] == h], backend="fastpar")
            if host_of[RANK] == h:
                local = fd.get_fastpar_backend(g)
        leaders = [host_of.index(h) for h in range(len(hosts))]
        lg = dist.new_group(leaders, backend="gloo")
        leaders_be = lg._get_backend(torch.device("cpu")) if RANK in leaders else None
        world_be = dist.new_group(list(range(WORLD)), backend="gloo")._get_backend(torch.device("cpu"))
        hb = fastpar._C.HierarchicalEngine(RANK, WORLD, host_of, local, leaders_be, world_be)
        name = f"fastpar_composed_{layout.lower()}"
        dist.Backend.register_backend(name, lambda *_: hb, devices=["cpu"])
        g = dist.new_group(list(range(WORLD)), backend=name)
        x = data(RANK, 1000, torch.float32)
        dist.all_reduce(x, op=dist.ReduceOp.AVG, group=g)
        check(x, reference([data(q, 1000, torch.float32) for q in range(WORLD)], dist.ReduceOp.AVG, torch.float32),
              f"composed all_reduce AVG {layout}", exact=False)
        hier_collectives(g, f"{layout} host {layout[RANK]}", be=hb)
        # async_op: the Work's Future holds the tensors (what DDP comm hooks read)
        x = torch.full((5,), float(RANK))
        work = dist.all_reduce(x, async_op=True, group=g)
        work.wait()
        value = work.get_future().wait()
        assert isinstance(value, list) and torch.equal(value[0], x), value
        check(x, torch.full((5,), float(sum(range(WORLD)))), f"composed async all_reduce {layout}")
        before = hb.hierarchical_calls
        x = torch.full((3,), 1 + RANK, dtype=torch.int32)
        dist.all_reduce(x, op=dist.ReduceOp.BOR, group=g)  # no hierarchical schedule: the world backend's
        check(x, torch.full((3,), reference_bor(WORLD), dtype=torch.int32), f"composed all_reduce BOR {layout}")
        assert hb.hierarchical_calls == before, "BOR is expected on the world backend"
    finish()


def reference_bor(world: int) -> int:
    v = 0
    for q in range(world):
        v |= 1 + q
    return v


def sc_ddp():
    """Stock DistributedDataParallel on fastpar matches single-process training."""
    init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()
    ref.load_state_dict(model.state_dict())
    if RANK != 0:  # different local init: DDP must broadcast rank 0's weights
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for step in range(5):
        x = torch.randn(WORLD * 6, 8, generator=g, dtype=torch.float64)
        y = torch.randn(WORLD * 6, 4, generator=g, dtype=torch.float64)
        mine = slice(RANK * 6, (RANK + 1) * 6)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x[mine]), y[mine]).backward()
        opt.step()
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12, msg=lambda m: f"{name}: {m}")
    dist.destroy_process_group()


def sc_device_backends():
    """init_process_group(ARGS[0]) with fastpar registered for cpu and cuda, on
    any machine: torch builds one fastpar object and registers it for CUDA (and
    for CPU unless ARGS[0] names another CPU backend); CPU collectives are
    right; tensors on a device fastpar does not serve are refused by name."""
    spec = ARGS[0]
    init(backend=spec)
    pg = dist.group.WORLD
    on_cuda = pg._get_backend(torch.device("cuda"))
    assert isinstance(on_cuda, fastpar._C.Backend), f"{spec}: CUDA backend is {type(on_cuda).__name__}"
    if fd.cuda_supported():
        assert isinstance(on_cuda.cuda_engine, fastpar._C.CudaEngine), type(on_cuda.cuda_engine)
        assert on_cuda.cuda_engine.ipc_state == "not set up", on_cuda.cuda_engine.ipc_state
    else:  # CPU-only build or no GPU: CUDA tensors get the error, as before
        assert on_cuda.cuda_engine is None, on_cuda.cuda_engine
    on_cpu = pg._get_backend(torch.device("cpu"))
    if spec.startswith("cpu:gloo"):
        assert isinstance(on_cpu, dist.ProcessGroupGloo), type(on_cpu)
    else:
        assert isinstance(on_cpu, fastpar._C.Backend) and on_cpu.local_size == WORLD, type(on_cpu)
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for n in (0, 5, 3001):
            xs = [data(q, n, dtype) for q in range(WORLD)]
            tag = f"{spec} {dtype} n={n}"
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
                t = xs[RANK].clone()
                dist.all_reduce(t, op=op)
                check(t, reference(xs, op, dtype), f"all_reduce {op} {tag}")
            t = xs[RANK].clone()
            dist.broadcast(t, src=WORLD - 1)
            check(t, xs[WORLD - 1], f"broadcast {tag}")
            out = [torch.empty(n, dtype=dtype) for _ in range(WORLD)]
            dist.all_gather(out, xs[RANK])
            for q in range(WORLD):
                check(out[q], xs[q], f"all_gather [{q}] {tag}")
    t = data(RANK, 64, torch.float32)
    work = dist.all_reduce(t, async_op=True)
    assert work.wait() is True
    check(work.get_future().wait()[0], reference([data(q, 64, torch.float32) for q in range(WORLD)],
                                                 dist.ReduceOp.SUM, torch.float32), f"{spec} async all_reduce")
    dist.barrier()
    # A device fastpar does not serve. Called on the backend object itself:
    # torch's dispatcher answers collectives on meta tensors without calling
    # any backend (dist.all_reduce(meta) returns at once, as for every backend).
    meta = torch.empty(4, device="meta")
    calls = {
        "fastpar.all_reduce: tensors[0] is on device 'meta'": lambda: on_cuda.allreduce([meta]),
        "fastpar.broadcast: tensors[0] is on device 'meta'": lambda: on_cuda.broadcast([meta]),
        "fastpar.all_gather: input_tensors[0] is on device 'meta'":
            lambda: on_cuda.allgather([[meta] * WORLD], [meta]),
    }
    for want, call in calls.items():
        try:
            call()
        except ValueError as e:
            assert want in str(e) and "handles CPU and CUDA tensors only" in str(e), f"{want!r} not in: {e}"
        else:
            raise AssertionError(f"no error; expected {want!r}")
    t = torch.full((3,), float(RANK))
    dist.all_reduce(t)  # still usable after the refusals
    assert torch.all(t == sum(range(WORLD)))
    print(f"{spec}: rank {RANK} ok", flush=True)
    finish()


# The device the surface scenarios run on (FASTPAR_TEST_DEVICE: "cpu", or
# "cuda" where ranks share cuda:0).
DEVICE = torch.device(os.environ.get("FASTPAR_TEST_DEVICE", "cpu"))


def sc_surface():
    """Every torch.distributed call shape torch 2.11-2.14 programs use beyond
    the classic collectives (the *_single and coalesced forms, coalescing
    blocks, gather into one tensor, mixed batch_isend_irecv, monitored
    barrier), on DEVICE, checked against values every rank can compute."""
    init()
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
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=TIMEOUT_S), wait_all_ranks=True)
    finish()


def sc_monitored_barrier_timeout():
    """A rank that comes late: rank 0 names it, as gloo does."""
    init()
    if RANK == WORLD - 1:
        time.sleep(2.5)
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=1), wait_all_ranks=True)
    except RuntimeError as e:
        print("ERROR:", e, flush=True)
    dist.barrier()
    finish()


def sc_suite():
    """Several scenarios in one process group (process start-up dominates the
    test time on a loaded 2-core machine): ARGS name them; allreduce_one_shot /
    allreduce_two_shot force that schedule for the sizes that allow it."""
    global _IN_SUITE
    _IN_SUITE = True
    init()
    for part in ARGS:
        t0 = time.monotonic()
        if part.startswith("allreduce_"):
            algo = {"allreduce_one_shot": 1, "allreduce_two_shot": 2}[part]
            fd.get_fastpar_backend()._set_allreduce_tuning(-1, algo)
            sc_allreduce(sizes=(0, 1, 33, 999))
            fd.get_fastpar_backend()._set_allreduce_tuning(-1, 0)
        else:
            globals()["sc_" + part]()
        print(f"{part}: ok in {time.monotonic() - t0:.1f}s", flush=True)
    _IN_SUITE = False
    dist.destroy_process_group()


def sc_torchrun():
    """Run under torchrun (env://): the 'done when' smoke test. ARGS[0], if
    given, is the backend string (default "fastpar")."""
    spec = ARGS[0] if ARGS else "fastpar"
    dist.init_process_group(spec, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    r, w = dist.get_rank(), dist.get_world_size()
    t = torch.full((4,), float(r))
    dist.all_reduce(t)
    assert torch.all(t == sum(range(w)))
    assert dist.get_backend() == spec, dist.get_backend()
    assert isinstance(dist.group.WORLD._get_backend(torch.device("cuda")), fastpar._C.Backend)
    dist.destroy_process_group()
    print(f"torchrun rank {r} ok")


if __name__ == "__main__":
    globals()["sc_" + SCENARIO]()
