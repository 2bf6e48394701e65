"""The hierarchical paths: fake hosts (FASTPAR_HOST_ID) with shared memory
inside and gloo between the leaders, every collective with a hierarchical
schedule against a reference, and every dtype through the calls that cross
hosts as bytes; fastpar._C.HierarchicalEngine (the composition
CUDA tensors get on several hosts) run on CPU stand-ins, and its refusal of a
composition that does not match its host layout, naming the argument and
both values, before any call."""
from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.distributed as dist

import fastpar
import fastpar.distributed as fd
from dist_harness import assert_ok, run, scenario
from reference import exact_data, reference
from worker_context import ARGS, RANK, WORLD, check, finish, init, ops_for

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


def gloo_of_one():
    """A real one-rank backend (gloo over a local HashStore): no peers to wait for."""
    return dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=5))


def fake_backend(rank, size):
    """A backend that is never called (torch's fake one): the rank and size
    the constructor's checks read, with no peer to wait for."""
    return torch._C._distributed_c10d.FakeProcessGroup._create_internal(rank, size)


def build(rank, size, host_of, local, leaders, world, columns=None):
    return fastpar._C.HierarchicalEngine(rank, size, host_of, local, leaders, world, columns)


def shm_of_one():
    """fastpar's shared-memory engine of a one-rank host."""
    return fastpar._C.ShmEngine(dist.HashStore(), 0, 1, [0], 5000)


def test_front_checks_its_engines():
    # fastpar.distributed composes the engines; the front refuses ones that do
    # not fit the group, naming what is wrong.
    with pytest.raises(ValueError, match=r"shm has 1 ranks but the group has 2 \(a group over several hosts needs "
                                         r"hierarchical\)"):
        fastpar._C.Backend(0, 2, 5000, shm_of_one())
    hier = build(0, 2, [0, 1], shm_of_one(), fake_backend(0, 2), fake_backend(0, 2))
    with pytest.raises(ValueError, match=r"hierarchical's local engine is not shm"):
        fastpar._C.Backend(0, 2, 5000, shm_of_one(), hierarchical=hier)
    with pytest.raises(ValueError, match=r"hierarchical is rank 0 of 2 but the group's rank is 0 of 3"):
        fastpar._C.Backend(0, 3, 5000, hier.local, hierarchical=hier)
    with pytest.raises(ValueError, match=r"global_ranks has 2 entries but the host has 1 ranks"):
        fastpar._C.ShmEngine(dist.HashStore(), 0, 1, [0, 1], 5000)
    front = fastpar._C.Backend(0, 2, 5000, hier.local, hierarchical=hier)
    assert front.hierarchical and front.local_size == 1


def test_host_of_must_cover_the_group():
    with pytest.raises(ValueError, match=r"host_of has 1 entries but the group has 2 ranks"):
        build(0, 2, [0], gloo_of_one(), gloo_of_one(), gloo_of_one())


def test_hosts_are_numbered_by_lowest_rank():
    with pytest.raises(ValueError, match=r"host_of\[0\] is 1 but hosts must be numbered in order of their lowest rank"):
        build(0, 2, [1, 0], gloo_of_one(), gloo_of_one(), gloo_of_one())


def test_local_backend_must_span_this_host():
    # Ranks 0 and 1 on host 0: the local backend must be rank 0 of 2.
    with pytest.raises(ValueError, match=r"local backend is rank 0 of 1 but rank 0 is rank 0 of the 2 ranks of host 0"):
        build(0, 3, [0, 0, 1], gloo_of_one(), gloo_of_one(), gloo_of_one())


def test_only_host_leaders_have_a_leaders_backend():
    with pytest.raises(ValueError, match=r"rank 0 leads its host but has no leaders backend"):
        build(0, 2, [0, 1], gloo_of_one(), None, gloo_of_one())


def test_leaders_backend_spans_the_hosts():
    with pytest.raises(ValueError, match=r"leaders backend is rank 0 of 1 but this is host 0 of 2"):
        build(0, 2, [0, 1], gloo_of_one(), gloo_of_one(), gloo_of_one())


def test_columns_need_hosts_of_one_size():
    # Rank 0 of host 0 (ranks 0, 1) beside host 1 (rank 2 alone): no columns.
    with pytest.raises(ValueError, match=r"sharded all_reduce \(columns\) needs the same number of ranks on every "
                                         r"host, but host 0 has 2 and host 1 has 1"):
        build(0, 3, [0, 0, 1], fake_backend(0, 2), fake_backend(0, 2), fake_backend(0, 3), fake_backend(0, 2))


def test_columns_backend_spans_the_hosts():
    # 2 hosts of 1 rank: the columns backend must be rank 0 of 2 (one rank per host).
    with pytest.raises(ValueError, match=r"columns backend is rank 0 of 1 but this is host 0 of 2"):
        build(0, 2, [0, 1], gloo_of_one(), fake_backend(0, 2), fake_backend(0, 2), gloo_of_one())


def test_columns_are_the_ranks_of_one_local_index_on_every_host():
    from fastpar.distributed.backend import _columns
    assert _columns([0, 0, 1, 1], 1, "sharded") == [1, 3]
    assert _columns([0, 1, 0, 1], 2, "sharded") == [2, 3]  # hosts interleaved: host 0 holds ranks 0, 2
    assert _columns([0, 0, 0, 1, 1, 1, 2, 2, 2], 4, "sharded") == [1, 4, 7]
    assert _columns([0, 0, 1, 1], 1, "leaders") is None
    assert _columns([0, 0, 1], 0, "sharded") is None  # hosts of 2 and 1 ranks
    assert _columns([0, 1], 0, "sharded") is None  # one rank per host: the leaders' schedule is the same
    assert _columns([0, 0], 0, "sharded") is None  # one host


def test_a_valid_composition_of_one_host_reports_its_parts():
    local, leaders, world = gloo_of_one(), gloo_of_one(), gloo_of_one()
    hb = build(0, 1, [0], local, leaders, world)
    assert hb.rank() == 0 and hb.size() == 1
    assert hb.hierarchical_calls == 0
    assert hb.local is not None and hb.leaders is not None and hb.world is not None
    assert hb.columns is None and hb.hosts_allreduce == "leaders"


@scenario
def sc_hierarchical():
    """FASTPAR_HOST_ID fakes hosts: shm inside, gloo between leaders."""
    init()
    backend = fd.get_fastpar_backend()
    assert backend.hierarchical, "expected the hierarchical path with several FASTPAR_HOST_IDs"
    schedule = os.environ.get("FASTPAR_HOSTS_ALLREDUCE", "leaders")
    assert backend.hosts_allreduce == schedule, (backend.hosts_allreduce, schedule)  # 2 hosts x 2 ranks
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16):
        for op in ops_for(dtype):
            for n in (0, 1, 7, 5003):
                xs = [exact_data(q, n, dtype) for q in range(WORLD)]
                t = xs[RANK].clone()
                dist.all_reduce(t, op=op)
                check(t, reference(xs, op), f"hierarchical all_reduce {dtype} {op} n={n}",
                      exact=op != dist.ReduceOp.AVG)
    # From 2 MiB CPU tensors run in pieces: 2 pieces of an even length (the
    # sharded schedule reduces in place), 3 of an odd one (through a scratch copy)
    for n in ((2 << 20) // 4, (3 << 20) // 4 + 3):
        xs = [exact_data(q, n, torch.float32) for q in range(WORLD)]
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
            t = xs[RANK].clone()
            dist.all_reduce(t, op=op)
            check(t, reference(xs, op), f"hierarchical all_reduce float32 {op} n={n} ({schedule})")
    xs = [exact_data(q, 33, torch.float32) for q in range(WORLD)]
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
        be = fd.get_fastpar_backend(g)  # created now, with this rank's host id
        assert be.hosts_allreduce == expected_schedule(layout), (layout, be.hosts_allreduce)
        hier_collectives(g, os.environ["FASTPAR_HOST_ID"])
    os.environ["FASTPAR_HOST_ID"] = saved
    dist.barrier()


def expected_schedule(layout: str) -> str:
    """The all_reduce schedule between hosts a group of this layout ("AAB":
    ranks 0, 1 on host A, rank 2 on B) runs under this process's
    FASTPAR_HOSTS_ALLREDUCE: sharded only where every host holds the same
    number (2 or more) of ranks."""
    counts = [layout.count(h) for h in dict.fromkeys(layout)]
    even = len(counts) > 1 and len(set(counts)) == 1 and counts[0] >= 2
    sharded = os.environ.get("FASTPAR_HOSTS_ALLREDUCE", "leaders") == "sharded"
    return "sharded" if sharded and even else "leaders"


def hier_collectives(g, host: str, be=None):
    """all_reduce, broadcast, reduce, all_gather(_into_tensor), reduce_scatter(_tensor) on
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
            xs = [exact_data(q, n, dtype) for q in range(n_ranks)]
            for op in ops:
                t = xs[me].clone()
                dist.all_reduce(t, op=op, group=g)
                hier(f"all_reduce {tag}")
                check(t, reference(xs, op), f"all_reduce {op} {tag}", op != AVG)
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
                        check(t, reference(xs, op), f"reduce root={root} {op} {tag}", exact)
                    else:
                        check(t, xs[me], f"reduce leaves non-root input alone root={root} {op} {tag}")
                full = [exact_data(q, n_ranks * n, dtype, seed=5) for q in range(n_ranks)]
                ref = reference(full, op)[me * n:(me + 1) * n]
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
    xs = [exact_data(q, 33, torch.float32) for q in range(n_ranks)]
    gl = [torch.empty(33) for _ in range(n_ranks)] if me == n_ranks - 1 else None
    dist.gather(xs[me], gl, dst=glob(n_ranks - 1), group=g)
    if gl is not None:
        for q in range(n_ranks):
            check(gl[q], xs[q], f"gather [{q}] {host}")
    o = torch.empty(33)
    dist.scatter(o, xs if me == 1 else None, src=glob(1), group=g)
    check(o, xs[me], f"scatter {host}")
    outs = [torch.empty(5) for _ in range(n_ranks)]
    dist.all_to_all(outs, [exact_data(me * n_ranks + q, 5, torch.float32) for q in range(n_ranks)], group=g)
    for q in range(n_ranks):
        check(outs[q], exact_data(q * n_ranks + me, 5, torch.float32), f"all_to_all from {q} {host}")
    assert be.hierarchical_calls == before, "gather/scatter/all_to_all are expected on world gloo"
    # bool, complex and bitwise reductions: shared memory inside each host (bool
    # as uint8, complex as its parts), gloo between hosts, or world gloo (BXOR)
    t = torch.tensor([me == 0, False, True])
    dist.all_reduce(t, group=g)
    check(t, torch.tensor([True, False, True]), f"all_reduce bool SUM {host}")
    c = torch.complex(torch.arange(4.0) + me, -torch.arange(4.0))
    dist.reduce(c, dst=glob(0), op=AVG, group=g)
    if me == 0:
        check(c, torch.complex(torch.arange(4.0) + (n_ranks - 1) / 2, -torch.arange(4.0)), f"reduce complex AVG {host}")
    x = torch.full((3,), 1 << me, dtype=torch.int32)
    dist.all_reduce(x, op=dist.ReduceOp.BXOR, group=g)
    check(x, torch.full((3,), (1 << n_ranks) - 1, dtype=torch.int32), f"all_reduce BXOR {host}")
    x = torch.full((3,), 1 << me, dtype=torch.int32)
    dist.reduce(x, dst=glob(n_ranks - 1), op=dist.ReduceOp.BOR, group=g)  # on world gloo, which writes non-roots
    want = (1 << n_ranks) - 1 if me == n_ranks - 1 else 1 << me
    check(x, torch.full((3,), want, dtype=torch.int32), f"reduce BOR (non-root inputs left alone) {host}")
    print(f"hierarchical collectives ok: {host} rank {me} of {n_ranks}, {be.hierarchical_calls} hierarchical calls",
          flush=True)


@pytest.mark.usefixtures("no_leftover_segments")
def test_hierarchical_two_hosts_of_two():
    """2 fake hosts x 2 ranks (world group), then, in new groups of the same 4
    processes, hosts interleaved in rank (A,B,A,B), uneven (A,A,B), uneven and
    interleaved (A,B,A over ranks 1-3) and 3+1 (A,A,A,B): every collective that
    has a hierarchical schedule, against a reference, with a 4 KiB slot so the
    larger sizes cross many chunks; one launch keeps start-up cost down."""
    host = lambda r: {"FASTPAR_HOST_ID": "nodeA" if r < 2 else "nodeB"}  # noqa: E731
    layouts = ["0,1,2,3:ABAB", "0,1,2:AAB", "1,2,3:ABA", "0,1,2,3:AAAB"]
    results = run(sc_hierarchical, 4, per_rank_env=host, env={"FASTPAR_SHM_SLOT_BYTES": "4096"}, args=layouts,
                  timeout=240)
    assert_ok(results)
    out = "".join(r.out for r in results)
    for layout in ["nodeA", "nodeB", "hostA", "hostB"]:
        assert f"hierarchical collectives ok: {layout}" in out, out
    assert out.count("hierarchical collectives ok") == 4 + 4 + 3 + 3 + 4, out


@pytest.mark.usefixtures("no_leftover_segments")
def test_sharded_all_reduce_between_fake_hosts():
    """FASTPAR_HOSTS_ALLREDUCE=sharded: 2 fake hosts x 2 ranks (world group)
    and hosts interleaved in rank (A,B,A,B) run the sharded all_reduce, the
    uneven A,A,B the leaders' one; every collective against a reference."""
    host = lambda r: {"FASTPAR_HOST_ID": "nodeA" if r < 2 else "nodeB"}  # noqa: E731
    results = run(sc_hierarchical, 4, per_rank_env=host,
                  env={"FASTPAR_SHM_SLOT_BYTES": "4096", "FASTPAR_HOSTS_ALLREDUCE": "sharded"},
                  args=["0,1,2,3:ABAB", "0,1,2:AAB"], timeout=240)
    assert_ok(results)
    assert "".join(r.out for r in results).count("hierarchical collectives ok") == 4 + 4 + 3


# Dtypes fastpar's shared memory carries and gloo's gather, scatter and
# all_to_all refuse ("Invalid scalar type"), and two it takes.
CROSSING_DTYPES = [torch.complex64, torch.complex128, torch.int16, torch.uint16, torch.uint32, torch.uint64,
                   torch.float8_e4m3fn, torch.float8_e5m2, torch.bool, torch.float32]


def same_bytes(got: torch.Tensor, want: torch.Tensor, what: str):
    """Bitwise equality for every dtype (torch.equal has no float8 kernels)."""
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype} {got.shape} != {want.dtype} {want.shape}"
    g, w = got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8)
    assert torch.equal(g, w), f"{what}: got {got.flatten()[:6]} want {want.flatten()[:6]}"


@scenario
def sc_every_dtype_between_hosts():
    """Hosts A (ranks 0, 1) and B (2, 3): every copying collective and
    point-to-point call of every dtype the group takes on one host, roots on
    either host; complex reduce and reduce_scatter (SUM, AVG); one-element
    tensors of a step slice; an async gather's Work reports the caller's
    tensors."""
    init()
    assert fd.get_fastpar_backend().hierarchical

    def x(q, n=6, dtype=torch.float32):  # rank q's data; 0..n-1 are exact in every dtype, float8 too
        return (torch.arange(n) + q).remainder(8).to(dtype)

    for dt in CROSSING_DTYPES:
        what = lambda op: f"{op} {dt} between hosts"  # noqa: E731
        t = x(RANK, dtype=dt)
        dist.broadcast(t, src=1)
        same_bytes(t, x(1, dtype=dt), what("broadcast"))
        outs = [torch.empty(6, dtype=dt) for _ in range(WORLD)]
        dist.all_gather(outs, x(RANK, dtype=dt))
        for q in range(WORLD):
            same_bytes(outs[q], x(q, dtype=dt), what(f"all_gather [{q}]"))
        outs = [torch.empty(6, dtype=dt) for _ in range(WORLD)] if RANK == 3 else None
        dist.gather(x(RANK, dtype=dt), outs, dst=3)
        for q in range(WORLD if RANK == 3 else 0):
            same_bytes(outs[q], x(q, dtype=dt), what(f"gather [{q}]"))
        out = torch.empty(6, dtype=dt)
        dist.scatter(out, [x(10 + q, dtype=dt) for q in range(WORLD)] if RANK == 0 else None, src=0)
        same_bytes(out, x(10 + RANK, dtype=dt), what("scatter"))
        # rows of 3; rank q sends q + i rows to rank i (uneven, none from rank 0 to 0)
        rows = lambda q, i: q + i  # noqa: E731
        mine = torch.cat([x(10 * RANK + i, 3 * rows(RANK, i), dt).view(-1, 3) for i in range(WORLD)])
        got = torch.empty(sum(rows(q, RANK) for q in range(WORLD)), 3, dtype=dt)
        dist.all_to_all_single(got, mine, [rows(q, RANK) for q in range(WORLD)], [rows(RANK, i) for i in range(WORLD)])
        want = torch.cat([x(10 * q + RANK, 3 * rows(q, RANK), dt).view(-1, 3) for q in range(WORLD)])
        same_bytes(got, want, what("all_to_all_single"))
        if RANK in (0, 2):  # host A to host B and back
            t = x(RANK, dtype=dt)
            if RANK == 0:
                dist.send(t, 2)
                dist.recv(t, 2)
            else:
                r = torch.empty(6, dtype=dt)
                dist.recv(r, 0)
                dist.send(x(RANK, dtype=dt), 0)
                t = r
            same_bytes(t, x(2 - RANK, dtype=dt), what("send/recv"))
    for dt in (torch.complex64, torch.complex128):
        xs = [torch.complex(exact_data(q, 5, torch.float64), exact_data(q + 1, 5, torch.float64)).to(dt)
              for q in range(WORLD)]
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            want = sum(xs[1:], xs[0]) / (WORLD if op == dist.ReduceOp.AVG else 1)
            t = xs[RANK].clone()
            dist.reduce(t, dst=2, op=op)
            if RANK == 2:
                torch.testing.assert_close(t, want, msg=lambda m: f"reduce {dt} {op}: {m}")
            ins = [[x_.roll(i) for i in range(WORLD)] for x_ in xs]
            out = torch.empty(5, dtype=dt)
            dist.reduce_scatter(out, ins[RANK], op=op)
            want = sum((ins[q][RANK] for q in range(1, WORLD)), ins[0][RANK]) / (WORLD if op == dist.ReduceOp.AVG else 1)
            torch.testing.assert_close(out, want, msg=lambda m: f"reduce_scatter {dt} {op}: {m}")
    # One element of a step slice: contiguous, with a stride of 2.
    base = torch.full((2,), float(RANK))
    dist.broadcast(base[::2], src=3)
    assert base.tolist() == [3.0, float(RANK)], base
    outs = [torch.zeros(4)[::2][:1] for _ in range(WORLD)]
    dist.all_gather(outs, torch.full((2,), float(RANK))[::2])
    assert [o.item() for o in outs] == [float(q) for q in range(WORLD)], outs
    # An async gather (which goes to the world backend): its Work and future give the caller's tensors.
    outs = [torch.empty(6, dtype=torch.int16) for _ in range(WORLD)] if RANK == 0 else None
    work = dist.gather(x(RANK, dtype=torch.int16), outs, dst=0, async_op=True)
    work.wait()
    if RANK == 0:
        value = work.get_future().value()
        assert [v.dtype for v in value] == [torch.int16] * WORLD, value
        assert [v.data_ptr() for v in value] == [o.data_ptr() for o in outs]
    dist.barrier()
    print("every dtype crossed", flush=True)
    finish()


@pytest.mark.usefixtures("no_leftover_segments")
def test_every_dtype_crosses_between_hosts():
    """What a group on one host carries, a group over several hosts carries
    too, although gloo between them refuses many of these dtypes."""
    host = lambda r: {"FASTPAR_HOST_ID": "nodeA" if r < 2 else "nodeB"}  # noqa: E731
    results = run(sc_every_dtype_between_hosts, 4, per_rank_env=host, timeout=120)
    assert_ok(results)
    assert all("every dtype crossed" in r.out for r in results)


@scenario
def sc_hosts_allreduce_disagreement():
    """Rank 1 sets FASTPAR_HOSTS_ALLREDUCE unlike the others: every rank's
    group creation is refused, naming both values and both ranks."""
    try:
        init()
    except ValueError as e:
        msg = str(e)
        assert "FASTPAR_HOSTS_ALLREDUCE is" in msg and "every rank of a group must set it alike" in msg, msg
        assert "'sharded'" in msg and "'leaders'" in msg, msg
        print("refused:", msg, flush=True)
        return
    raise AssertionError("group created although the ranks chose different schedules")


def test_ranks_that_choose_different_hosts_allreduce_are_refused():
    env = lambda r: {"FASTPAR_HOST_ID": f"node{r % 2}",  # noqa: E731
                     "FASTPAR_HOSTS_ALLREDUCE": "sharded" if r == 1 else "leaders"}
    results = run(sc_hosts_allreduce_disagreement, 2, per_rank_env=env, timeout=60)
    assert_ok(results)
    assert all("refused:" in r.out for r in results), [r.out for r in results]


@scenario
def sc_bad_hosts_knob():
    """ARGS: the variable, its value (set in the environment) and the message expected."""
    name, value, message = ARGS
    try:
        init()
    except ValueError as e:
        assert message in str(e), str(e)
        print("refused", flush=True)
        return
    raise AssertionError(f"{name}={value} accepted")


@pytest.mark.parametrize("name,value,message", [
    ("FASTPAR_HOSTS_ALLREDUCE", "rings", "FASTPAR_HOSTS_ALLREDUCE is 'rings' but must be 'leaders' or 'sharded'"),
    ("FASTPAR_HOSTS_FAILURE_POLL_MS", "-5",
     "FASTPAR_HOSTS_FAILURE_POLL_MS is '-5' but must be a whole number of milliseconds"),
], ids=["hosts_allreduce", "failure_poll"])
def test_a_bad_hosts_knob_is_refused_by_name(name, value, message):
    results = run(sc_bad_hosts_knob, 1, env={name: value}, args=[name, value, message], timeout=60)
    assert_ok(results)
    assert "refused" in results[0].out


@scenario
def sc_composed_hierarchical():
    """fastpar._C.HierarchicalEngine (the CUDA path's composition on several
    hosts) over CPU stand-ins: the shared-memory engine of a fastpar group per
    fake host as `local`, gloo among the leaders and over the world; one group
    per layout in ARGS ("AABB": ranks 0,1 on host A, 2,3 on B), behind a front
    of its own, through torch.distributed."""
    init()
    for spec in ARGS:
        layout, _, schedule = spec.partition("/")
        hosts = list(dict.fromkeys(layout))
        host_of = [hosts.index(c) for c in layout]
        local = None
        for h in range(len(hosts)):  # new_group is collective: every rank creates every host's group
            g = dist.new_group([r for r in range(WORLD) if host_of[r] == h], backend="fastpar")
            if host_of[RANK] == h:
                local = fd.get_fastpar_backend(g).shm_engine
        leaders = [host_of.index(h) for h in range(len(hosts))]
        lg = dist.new_group(leaders, backend="gloo")
        leaders_be = lg._get_backend(torch.device("cpu")) if RANK in leaders else None
        world_be = dist.new_group(list(range(WORLD)), backend="gloo")._get_backend(torch.device("cpu"))
        columns_be = None
        if schedule == "sharded":  # a gloo group per local index: its rank on every host, host by host
            per_host = [[r for r in range(WORLD) if host_of[r] == h] for h in range(len(hosts))]
            for c in range(len(per_host[0])):
                cg = dist.new_group([rs[c] for rs in per_host], backend="gloo")
                if per_host[host_of[RANK]].index(RANK) == c:
                    columns_be = cg._get_backend(torch.device("cpu"))
        hb = fastpar._C.HierarchicalEngine(RANK, WORLD, host_of, local, leaders_be, world_be, columns_be)
        assert hb.hosts_allreduce == (schedule or "leaders"), hb.hosts_allreduce
        name = f"fastpar_composed_{layout.lower()}_{schedule or 'leaders'}"
        front = fastpar._C.Backend(RANK, WORLD, 60_000, local, hierarchical=hb)
        dist.Backend.register_backend(name, lambda *_: front, devices=["cpu"])
        g = dist.new_group(list(range(WORLD)), backend=name)
        x = exact_data(RANK, 1000, torch.float32)
        dist.all_reduce(x, op=dist.ReduceOp.AVG, group=g)
        check(x, reference([exact_data(q, 1000, torch.float32) for q in range(WORLD)], dist.ReduceOp.AVG),
              f"composed all_reduce AVG {layout}", exact=False)
        hier_collectives(g, f"{spec} host {layout[RANK]}", be=hb)
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


@pytest.mark.usefixtures("no_leftover_segments")
def test_composed_hierarchical_backend():
    """fastpar._C.HierarchicalEngine, the composition CUDA tensors get on
    several hosts (CUDA IPC inside, NCCL between), run on CPU stand-ins: a
    fastpar group per fake host, gloo among the leaders and over the world
    (and, for the sharded all_reduce, in each column). Hosts contiguous (AABB),
    interleaved (ABAB) and uneven (AAAB): every collective with a
    hierarchical schedule against a reference, and the forwarded ones."""
    specs = ["AABB", "ABAB", "AAAB", "AABB/sharded", "ABAB/sharded"]
    results = run(sc_composed_hierarchical, 4, env={"FASTPAR_SHM_SLOT_BYTES": "4096"}, args=specs, timeout=300)
    assert_ok(results)
    out = "".join(r.out for r in results)
    for spec in specs:
        assert out.count(f"hierarchical collectives ok: {spec} ") == 4, out
