"""One rank of a several-host test (tests/multihost), under torchrun or started
directly (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment).

    python mh_worker.py collectives HOSTS   every collective, point to point, a
                                            subgroup across hosts, stock DDP and
                                            fastpar DDP, against local references
    python mh_worker.py fault KIND ...      a loop of all_reduce until it fails
                                            (KIND: kill VICTIM | loop)

Each rank prints one line per passed check group ("rank R ok: WHAT") and
exits 0; a wrong result raises (exit 1) naming the rank, what and the values.
Data are small integers in floating point, so every order of summation gives
the same bits and results are compared exactly.
"""
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
from fastpar.distributed import backend as fd_backend

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]


def say(what: str) -> None:
    print(f"rank {RANK} ok: {what}", flush=True)


def data(rank: int, n: int, dtype=torch.float32, salt: int = 0) -> torch.Tensor:
    """Rank `rank`'s data: integers in -3..3 (products of a few stay exact)."""
    g = torch.Generator().manual_seed(1000 * rank + 7 * n + salt)
    return torch.randint(-3, 4, (n,), generator=g).to(dtype)


def ref(xs: list[torch.Tensor], op) -> torch.Tensor:
    s = torch.stack(xs)
    if op == dist.ReduceOp.SUM:
        return s.sum(0)
    if op == dist.ReduceOp.AVG:
        return s.sum(0) / len(xs) if xs[0].is_floating_point() else torch.div(s.sum(0), len(xs), rounding_mode="trunc")
    if op == dist.ReduceOp.PRODUCT:
        return s.prod(0).to(xs[0].dtype)
    if op == dist.ReduceOp.MIN:
        return s.min(0).values
    return s.max(0).values


def check(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        bad = (got != want).nonzero()[:5].flatten().tolist() if got.shape == want.shape else "shape"
        raise AssertionError(f"rank {RANK}: {what}: got {got.dtype} {tuple(got.shape)} {got[:8].tolist()}, "
                             f"want {want.dtype} {tuple(want.shape)} {want[:8].tolist()} (differ at {bad})")


def host_layout() -> list[int]:
    """Each rank's host (hosts numbered by lowest rank), from fastpar's host ids;
    checks them against the hosts the launcher put the ranks on
    (FPMH_HOST, set by the test; torchrun's node rank is not the host's index)."""
    ids = [None] * WORLD
    dist.all_gather_object(ids, fd_backend._host_id())
    hosts = [None] * WORLD
    dist.all_gather_object(hosts, os.environ["FPMH_HOST"])
    order = list(dict.fromkeys(ids))
    layout = [order.index(i) for i in ids]
    for p in range(WORLD):
        for q in range(WORLD):
            if (ids[p] == ids[q]) != (hosts[p] == hosts[q]):
                raise AssertionError(f"rank {RANK}: ranks {p} and {q} are on hosts {hosts[p]} and {hosts[q]} "
                                     f"but fastpar's host ids are {ids[p]!r} and {ids[q]!r}")
    return layout


def collectives(expected_hosts: int) -> None:
    dist.init_process_group("fastpar", timeout=datetime.timedelta(seconds=60))
    backend = fd.get_fastpar_backend()
    layout = host_layout()
    if max(layout) + 1 != expected_hosts or not backend.hierarchical:
        raise AssertionError(f"rank {RANK}: {max(layout) + 1} hosts (hierarchical={backend.hierarchical}), "
                             f"expected {expected_hosts}: layout {layout}")
    counts = [layout.count(h) for h in range(max(layout) + 1)]
    even = len(set(counts)) == 1 and counts[0] >= 2
    want = os.environ.get("FASTPAR_HOSTS_ALLREDUCE", "leaders") if even else "leaders"
    if backend.hosts_allreduce != want:
        raise AssertionError(f"rank {RANK}: all_reduce runs {backend.hosts_allreduce!r} between hosts, "
                             f"expected {want!r} (hosts of {counts} ranks)")
    say(f"hosts {layout}, all_reduce {want}")
    for dtype in (torch.float32, torch.float64, torch.int64):
        for op in OPS:
            for n in (1, 1000, 70001, (1 << 20) + 3):  # the last in pieces (2 MiB and more)
                xs = [data(q, n, dtype) for q in range(WORLD)]
                t = xs[RANK].clone()
                dist.all_reduce(t, op=op)
                check(t, ref(xs, op), f"all_reduce {dtype} {op} n={n}")
    say("all_reduce")
    leaders = [layout.index(h) for h in range(max(layout) + 1)]
    roots = sorted({0, WORLD - 1, *leaders, *[r for r in range(WORLD) if r not in leaders][:1]})
    n = 4099
    xs = [data(q, n) for q in range(WORLD)]
    for root in roots:
        t = xs[RANK].clone()
        dist.broadcast(t, src=root)
        check(t, xs[root], f"broadcast root {root}")
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
            t = xs[RANK].clone()
            dist.reduce(t, dst=root, op=op)
            check(t, ref(xs, op) if RANK == root else xs[RANK], f"reduce {op} root {root}")
        outs = [torch.empty(n) for _ in range(WORLD)] if RANK == root else None
        dist.gather(xs[RANK].clone(), outs, dst=root)
        if RANK == root:
            for q in range(WORLD):
                check(outs[q], xs[q], f"gather root {root} [{q}]")
        parts = [data(100 + q, n) for q in range(WORLD)]
        t = torch.empty(n)
        dist.scatter(t, parts if RANK == root else None, src=root)
        check(t, parts[RANK], f"scatter root {root}")
    say(f"broadcast, reduce, gather, scatter from roots {roots}")
    outs = [torch.empty(n) for _ in range(WORLD)]
    dist.all_gather(outs, xs[RANK])
    for q in range(WORLD):
        check(outs[q], xs[q], f"all_gather [{q}]")
    out = torch.empty(WORLD * n)
    dist.all_gather_into_tensor(out, xs[RANK])
    check(out, torch.cat(xs), "all_gather_into_tensor")
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MIN):
        ins = [data(q, WORLD * 513, salt=1) for q in range(WORLD)]
        out = torch.empty(513)
        dist.reduce_scatter_tensor(out, ins[RANK], op=op)
        check(out, ref(ins, op)[RANK * 513:(RANK + 1) * 513], f"reduce_scatter_tensor {op}")
    # all_to_all_single with uneven splits: rank p sends p + q + 1 elements to rank q.
    send = [data(1000 * RANK + q, RANK + q + 1) for q in range(WORLD)]
    out = torch.empty(sum(p + RANK + 1 for p in range(WORLD)))
    dist.all_to_all_single(out, torch.cat(send), [p + RANK + 1 for p in range(WORLD)],
                           [RANK + q + 1 for q in range(WORLD)])
    check(out, torch.cat([data(1000 * p + RANK, p + RANK + 1) for p in range(WORLD)]), "all_to_all_single")
    for _ in range(3):
        dist.barrier()
    say("all_gather, all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single, barrier")
    point_to_point(layout)
    subgroup(layout)
    training()
    dist.barrier()
    dist.destroy_process_group()
    say("done")


def point_to_point(layout: list[int]) -> None:
    """A ring (each rank sends to the next), then a pair inside a host and a pair
    across hosts, each way, named so the test knows both kinds ran."""
    n = 10007
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    t = torch.empty(n)
    reqs = [dist.isend(data(RANK, n, salt=5), nxt), dist.irecv(t, prv)]
    for r in reqs:
        r.wait()
    check(t, data(prv, n, salt=5), f"ring recv from {prv}")
    same = next(((p, q) for p in range(WORLD) for q in range(p + 1, WORLD) if layout[p] == layout[q]), None)
    cross = next((p, q) for p in range(WORLD) for q in range(p + 1, WORLD) if layout[p] != layout[q])
    kinds = []
    for kind, pair in (("within a host", same), ("across hosts", cross)):
        if pair is None:
            continue
        p, q = pair
        for a, b in ((p, q), (q, p)):
            if RANK == a:
                dist.send(data(a, n, salt=9), b, tag=3)
            elif RANK == b:
                t = torch.empty(n)
                dist.recv(t, a, tag=3)
                check(t, data(a, n, salt=9), f"recv {kind} from {a}")
        kinds.append(f"{kind} {p}<->{q}")
    say("point to point: ring, " + ", ".join(kinds))


def subgroup(layout: list[int]) -> None:
    """A group of the last rank of each host plus rank 0: spans every host."""
    ranks = sorted({0} | {max(r for r in range(WORLD) if layout[r] == h) for h in range(max(layout) + 1)})
    g = dist.new_group(ranks, backend="fastpar")
    if RANK in ranks:
        n = 3001
        xs = {q: data(q, n, salt=11) for q in ranks}
        t = xs[RANK].clone()
        dist.all_reduce(t, group=g)
        check(t, ref(list(xs.values()), dist.ReduceOp.SUM), f"subgroup {ranks} all_reduce")
        t = xs[RANK].clone()
        dist.broadcast(t, src=ranks[-1], group=g)
        check(t, xs[ranks[-1]], f"subgroup {ranks} broadcast")
        outs = [torch.empty(n) for _ in ranks]
        dist.all_gather(outs, xs[RANK], group=g)
        for i, q in enumerate(ranks):
            check(outs[i], xs[q], f"subgroup {ranks} all_gather [{q}]")
        hosts = {layout[q] for q in ranks}
        if not fd.get_fastpar_backend(g).hierarchical or len(hosts) < 2:
            raise AssertionError(f"rank {RANK}: subgroup {ranks} should span hosts {sorted(hosts)}")
        say(f"subgroup {ranks} across hosts {sorted(hosts)}")
    dist.destroy_process_group(g)


def model() -> torch.nn.Module:
    torch.manual_seed(0)  # identical parameters on every rank
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(rank * 100 + step)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def training() -> None:
    """Stock DDP over fastpar and fastpar.DistributedDataParallel, 4 steps each:
    the parameters must be the same bits on every rank, and match one process
    stepping on the mean of every rank's gradient (computed here)."""
    for name, wrap in (("stock DDP", lambda m: torch.nn.parallel.DistributedDataParallel(m)),
                       ("fastpar.DistributedDataParallel", lambda m: fastpar.DistributedDataParallel(m))):
        net = wrap(model())
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        local = model()
        lopt = torch.optim.SGD(local.parameters(), lr=0.1)
        for step in range(4):
            x, y = batch(RANK, step)
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
            lopt.zero_grad()
            grads = []
            for q in range(WORLD):
                local.zero_grad()
                xq, yq = batch(q, step)
                torch.nn.functional.mse_loss(local(xq), yq).backward()
                grads.append([p.grad.clone() for p in local.parameters()])
            for i, p in enumerate(local.parameters()):
                p.grad = torch.stack([gr[i] for gr in grads]).mean(0)
            lopt.step()
        flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        every = [torch.empty_like(flat) for _ in range(WORLD)]
        dist.all_gather(every, flat)
        for q in range(WORLD):
            check(every[q], flat, f"{name}: rank {q}'s parameters vs this rank's")
        want = torch.cat([p.detach().reshape(-1) for p in local.parameters()])
        if not torch.allclose(flat, want, rtol=1e-5, atol=1e-6):
            raise AssertionError(f"rank {RANK}: {name}: parameters differ from one process's by "
                                 f"{(flat - want).abs().max().item()}")
        say(f"{name}: 4 steps, parameters identical on every rank")
        del net


def describe(e: BaseException) -> str:
    """An exception's type and the first line of its message, for the test to read."""
    name = "DistBackendError" if isinstance(e, dist.DistBackendError) else f"{type(e).__module__}.{type(e).__qualname__}"
    return f"{name} at {time.time():.3f}: {str(e).splitlines()[0][:600] if str(e) else ''}"


def fault(kind: str, args: list[str]) -> None:
    """all_reduce of 4 MiB in a loop until it fails; prints how (the exception's
    type) and when (wall clock: the test compares it with the fault's time).
    kind "kill": rank VICTIM SIGKILLs itself at iteration 5, printing the time
    first; then (LINGER, seconds) every survivor stays that long after raising
    (so that none learns of a failed peer from its exit) and calls all_reduce
    once more, which must raise too. kind "loop": the test makes the fault
    (link down, host gone)."""
    timeout = float(os.environ.get("FPMH_TIMEOUT", "10"))
    dist.init_process_group("fastpar", timeout=datetime.timedelta(seconds=timeout))
    victim = int(args[0]) if kind == "kill" else -1
    linger = float(args[1]) if kind == "kill" and len(args) > 1 else 0.0
    t = torch.ones(1 << 20)
    i = 0
    try:
        while True:
            if RANK == victim and i == 5:
                print(f"rank {RANK} killed at {time.time():.3f}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            t.fill_(1)
            dist.all_reduce(t)
            if t[0].item() != WORLD:
                raise AssertionError(f"rank {RANK}: all_reduce gave {t[0].item()}, want {WORLD}")
            if i == 2:
                print(f"rank {RANK} looping", flush=True)
            i += 1
            if i > 100000:
                raise AssertionError("no fault came")
    except Exception as e:  # noqa: BLE001  (the test requires DistBackendError, and fails naming another type)
        print(f"rank {RANK} raised {describe(e)} (after {i} calls)", flush=True)
    if linger:
        time.sleep(linger)
        try:
            t.fill_(1)
            dist.all_reduce(t)
            print(f"rank {RANK} again: no error", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"rank {RANK} again raised {describe(e)}", flush=True)
    print(f"rank {RANK} exiting at {time.time():.3f}", flush=True)


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "collectives":
        collectives(int(sys.argv[2]))
    elif what == "fault":
        fault(sys.argv[2], sys.argv[3:])
    else:
        raise SystemExit(f"mh_worker.py: unknown scenario {what!r} (collectives, fault)")
