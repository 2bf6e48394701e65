"""Scenarios of the collectives other than all_reduce (dist_worker.py runs
them): broadcast, reduce, all_gather(_into_tensor), reduce_scatter(_tensor),
gather, scatter, all_to_all(_single) and the coalesced forms against a
reference, and the argument errors. `collectives` takes DEV
(worker_context.py) and runs the body of that device (on CUDA: bitwise
against `in_rank_order`, every call over IPC where the group has it)."""
from __future__ import annotations

import torch
import torch.distributed as dist

import fastpar.distributed as fd
from reference import DTYPES, FLOATS, exact_data, in_rank_order, reference
from worker_context import (DEV, MAX_IPC, RANK, SHARED, WORLD, check, check_equal, cuda_backend, finish, init,
                            ops_for, peer_access_everywhere)


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
