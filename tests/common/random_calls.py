"""Random calls of every collective, drawn alike on every rank from a seed,
issued on this rank and checked against torch: the generator of
c10d/test_random_sequences.py (a reference for long sequences) and
faults/test_random_faults.py (a peer killed or stalled at a random call),
which both run it with run_sequence."""
from __future__ import annotations

import datetime
import functools
import random
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

import fastpar.distributed as fd
from reference import DTYPES, FLOATS, OPS, bitwise_fold, exact_data, reference
from worker_context import RANK, WORLD, check


# Element counts: empty, tiny, around the 4 KiB slot the tests set, many
# slots, and past the 2 MiB pipelining threshold.
SIZES = [0, 1, 3, 255, 1023, 1024, 1025, 4099, 20_000, 600_001]
SIZE_WEIGHTS = [2, 4, 4, 6, 4, 4, 4, 4, 2, 1]
REDUCING = ["all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_reduce_coalesced",
            "direct_all_reduce", "registered_all_reduce"]
COPYING = ["broadcast", "all_gather", "all_gather_into_tensor", "gather", "scatter", "all_to_all",
           "all_to_all_single", "ring_send_recv", "barrier", "direct_broadcast", "direct_all_gather_into_tensor",
           "all_gather_object"]
# Collectives whose tensors may have any strides (docs/semantics.md: a
# contiguous copy in, the result copied back).
ANY_STRIDES = {"all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "gather", "scatter"}
# Where torch hands complex tensors to the backend for SUM and AVG.
COMPLEX_OK = {"all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor"}
BITWISE = [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
COMPLEX = [torch.complex64, torch.complex128]


def make_groups(timeout_s: float | None = None):
    """(ranks, group) pairs: the world (group None), two overlapping
    subgroups and a singleton. Every rank creates every group, in one order;
    timeout_s: the subgroups' timeout (torch's default otherwise)."""
    timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
    groups = [(list(range(WORLD)), None)]
    for ranks in ([0, 1], list(range(1, WORLD)), [WORLD - 1]):
        groups.append((ranks, dist.new_group(ranks, timeout=timeout)))
    return groups


@dataclass
class Call:
    name: str
    dtype: torch.dtype
    op: ReduceOp | None
    n: int
    group: int
    root: int  # index in the group
    async_op: bool
    strided: bool


def draw(rng: random.Random, groups, one_host: bool) -> Call:
    """One call, the same on every rank (every draw is made whatever the
    rank, so the ranks' generators stay in step)."""
    name = rng.choice(REDUCING + COPYING)
    if name == "registered_all_reduce" and not one_host:
        name = "all_reduce"  # registered memory is one host's
    dtype = rng.choice(DTYPES + [torch.bool] + COMPLEX)
    if dtype in COMPLEX and name in REDUCING and name not in COMPLEX_OK:
        dtype = torch.float64
    if name not in REDUCING:
        op = None
    elif dtype in COMPLEX:
        op = rng.choice([ReduceOp.SUM, ReduceOp.AVG])
    elif dtype == torch.bool:
        op = rng.choice([o for o in OPS if o != ReduceOp.AVG] + BITWISE)
    elif dtype in INTS:
        op = rng.choice(OPS + BITWISE)
    else:
        op = rng.choice(OPS)
    if name == "registered_all_reduce" and (dtype == torch.bool or op in BITWISE):
        name = "all_reduce"  # registered tensors take the five ops of the eight dtypes
    n = rng.choices(SIZES, SIZE_WEIGHTS)[0]
    g = rng.randrange(len(groups))
    root = rng.randrange(len(groups[g][0]))
    # Registered tensors must be freed in the same order on every rank: such a
    # call completes (and its tensor goes) before the next, not at a time of
    # the rank's own.
    async_op = rng.random() < 0.3 and name != "registered_all_reduce"
    return Call(name, dtype, op, n, g, root, async_op, name in ANY_STRIDES and rng.random() < 0.25)


def _data(q: int, n: int, dtype, step: int, part: int = 0) -> torch.Tensor:
    """Rank q's input at this step (every rank computes every rank's)."""
    seed = step * 7 + part
    if dtype == torch.bool:
        return exact_data(q, n, torch.int64, seed) % 2 == 0
    if dtype in COMPLEX:
        real = torch.float32 if dtype == torch.complex64 else torch.float64
        return torch.complex(exact_data(q, n, real, seed), exact_data(q + 1, n, real, seed + 1))
    return exact_data(q, n, dtype, seed)


def _reference(xs, op):
    """op over the ranks' tensors, as fastpar and gloo compute it."""
    dtype = xs[0].dtype
    if dtype == torch.bool or op in BITWISE:
        return functools.reduce(bitwise_fold(op, dtype), xs)
    if dtype in COMPLEX:
        s = functools.reduce(torch.add, xs)
        return s / len(xs) if op == ReduceOp.AVG else s
    return reference(xs, op)


class _Buffers:
    """The step's tensors: contiguous, or every other element of a buffer
    twice as long whose gaps must keep the sentinel."""

    def __init__(self, strided: bool, dtype):
        self.strided, self.dtype, self.bases = strided, dtype, []

    def sentinel(self, n: int) -> torch.Tensor:
        return torch.full((n,), 99).to(self.dtype)

    def make(self, values: torch.Tensor) -> torch.Tensor:
        if not self.strided:
            return values.clone()
        base = self.sentinel(2 * values.numel())
        base[::2] = values
        self.bases.append(base)
        return base[::2]

    def empty(self, n: int) -> torch.Tensor:
        return self.make(self.sentinel(n))

    def check_gaps(self, what: str):
        for base in self.bases:
            assert torch.equal(base[1::2], self.sentinel(base.numel() // 2)), f"{what}: wrote between the elements"


def issue(c: Call, step: int, ranks, group, pending: list):
    """Issues call c on this rank; runs its check now, or queues it with the Work (async)."""
    k, me = len(ranks), ranks.index(RANK)
    root = ranks[c.root]
    name, dtype, op, n = c.name, c.dtype, c.op, c.n
    what = (f"step {step}: {name} {dtype} n={n} group={ranks} root={root}" + (f" {op}" if op is not None else "")
            + (" strided" if c.strided else ""))
    exact = dtype not in COMPLEX and (op != ReduceOp.AVG or dtype not in FLOATS)
    xs = [_data(q, n, dtype, step) for q in ranks]
    buf = _Buffers(c.strided, dtype)
    work = None
    kw = {"group": group, "async_op": c.async_op}

    if name == "all_reduce":
        t = buf.make(xs[me])
        work = dist.all_reduce(t, op=op, **kw)
        verify = lambda: check(t, _reference(xs, op), what, exact)  # noqa: E731
    elif name == "direct_all_reduce":
        t = xs[me].clone()
        fd.all_reduce(t, op=op, group=group)
        verify = lambda: check(t, _reference(xs, op), what, exact)  # noqa: E731
    elif name == "registered_all_reduce":
        t = fd.registered_empty(n, dtype=dtype, group=group)
        t.copy_(xs[me])
        work = dist.all_reduce(t, op=op, **kw)
        verify = lambda: check(t, _reference(xs, op), what, exact)  # noqa: E731
    elif name == "all_reduce_coalesced":
        ts = [x.clone() for x in xs[me].split(max(1, n // 3))] if n else [xs[me].clone()]
        with dist._coalescing_manager(group=group, async_ops=c.async_op) as cm:
            for t in ts:
                dist.all_reduce(t, op=op, group=group)
        work = cm if c.async_op else None
        verify = lambda: check(torch.cat(ts), _reference(xs, op), what, exact)  # noqa: E731
    elif name == "reduce":
        t = buf.make(xs[me])
        work = dist.reduce(t, dst=root, op=op, **kw)
        want = _reference(xs, op) if me == c.root else xs[me]
        verify = lambda: check(t, want, what, exact)  # noqa: E731
    elif name in ("reduce_scatter", "reduce_scatter_tensor"):
        ins = [[_data(q, n, dtype, step, part=i) for i in range(k)] for q in ranks]
        out = buf.empty(n)
        if name == "reduce_scatter":
            work = dist.reduce_scatter(out, [buf.make(x) for x in ins[me]], op=op, **kw)
        else:
            work = dist.reduce_scatter_tensor(out, torch.cat(ins[me]), op=op, **kw)
        want = _reference([ins[q][me] for q in range(k)], op)
        verify = lambda: check(out, want, what, exact)  # noqa: E731
    elif name in ("broadcast", "direct_broadcast"):
        t = buf.make(xs[me])
        if name == "broadcast":
            work = dist.broadcast(t, src=root, **kw)
        else:
            fd.broadcast(t, src=root, group=group)
        verify = lambda: check(t, xs[c.root], what)  # noqa: E731
    elif name == "all_gather":
        outs = [buf.empty(n) for _ in ranks]
        work = dist.all_gather(outs, buf.make(xs[me]), **kw)
        verify = lambda: [check(outs[i], xs[i], f"{what} [{i}]") for i in range(k)]  # noqa: E731
    elif name in ("all_gather_into_tensor", "direct_all_gather_into_tensor"):
        out = buf.empty(k * n)
        if name == "all_gather_into_tensor":
            work = dist.all_gather_into_tensor(out, xs[me], **kw)
        else:
            fd.all_gather_into_tensor(out, xs[me], group=group)
        verify = lambda: check(out, torch.cat(xs), what)  # noqa: E731
    elif name == "gather":
        outs = [buf.empty(n) for _ in ranks] if me == c.root else None
        work = dist.gather(buf.make(xs[me]), outs, dst=root, **kw)
        verify = lambda: outs is None or [check(outs[i], xs[i], f"{what} [{i}]") for i in range(k)]  # noqa: E731
    elif name == "scatter":
        parts = [_data(ranks[c.root], n, dtype, step, part=i) for i in range(k)]
        out = buf.empty(n)
        work = dist.scatter(out, [buf.make(p) for p in parts] if me == c.root else None, src=root, **kw)
        verify = lambda: check(out, parts[me], what)  # noqa: E731
    elif name == "all_to_all":
        # uneven: group rank q sends ((q + i) % 3) * n // 2 elements to group rank i
        size = lambda q, i: ((q + i) % 3) * n // 2  # noqa: E731
        ins = [[_data(q, size(q, i), dtype, step, part=i) for i in range(k)] for q in range(k)]
        outs = [buf.empty(size(i, me)) for i in range(k)]
        work = dist.all_to_all(outs, ins[me], **kw)
        verify = lambda: [check(outs[i], ins[i][me], f"{what} from {i}") for i in range(k)]  # noqa: E731
    elif name == "all_to_all_single":
        size = lambda q, i: ((q * 2 + i) % 3) * n // 3  # noqa: E731
        ins = [[_data(q, size(q, i), dtype, step, part=i) for i in range(k)] for q in range(k)]
        out = buf.empty(sum(size(i, me) for i in range(k)))
        work = dist.all_to_all_single(out, torch.cat(ins[me]), [size(i, me) for i in range(k)],
                                      [size(me, i) for i in range(k)], **kw)
        verify = lambda: check(out, torch.cat([ins[i][me] for i in range(k)]), what)  # noqa: E731
    elif name == "ring_send_recv":
        right, left = ranks[(me + 1) % k], ranks[(me - 1) % k]
        out = buf.empty(n)
        if k > 1:
            for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, xs[me], right, group),
                                               dist.P2POp(dist.irecv, out, left, group)]):
                req.wait()
        else:
            out.copy_(xs[me])
        verify = lambda: check(out, xs[(me - 1) % k], what)  # noqa: E731
    elif name == "all_gather_object":
        objs = [None] * k
        dist.all_gather_object(objs, {"rank": RANK, "step": step, "head": xs[me][:5].tolist()}, group=group)
        want = [{"rank": q, "step": step, "head": xs[i][:5].tolist()} for i, q in enumerate(ranks)]
        verify = lambda: objs == want or pytest.fail(f"{what}: {objs}")  # noqa: E731
    else:
        work = dist.barrier(**kw)
        verify = lambda: None  # noqa: E731

    def verify_all():
        verify()
        buf.check_gaps(what)

    if work is not None and c.async_op:
        pending.append((work, verify_all))
    else:
        verify_all()


def run_sequence(seed: int, steps: int, groups, one_host: bool, attempt=None, before=None) -> None:
    """Draws `steps` calls from `seed` and issues this rank's; async ones are
    waited a few calls later, in an order of the rank's own; then a world
    barrier. Every issue, wait and the barrier runs as attempt(step, fn)
    (default: fn()); before(step, pending) runs after each draw."""
    attempt = attempt or (lambda step, fn: fn())
    rng = random.Random(seed)
    mine = random.Random(seed * 1000 + RANK)  # this rank's own: when and in which order to wait
    pending: list = []
    for step in range(steps):
        c = draw(rng, groups, one_host)
        if before is not None:
            before(step, pending)
        ranks, group = groups[c.group]
        if RANK in ranks:
            attempt(step, lambda: issue(c, step, ranks, group, pending))
        if pending and mine.random() < 0.4:
            mine.shuffle(pending)
            for work, verify in pending:
                attempt(step, lambda: (work.wait(), verify()))
            pending.clear()
    for work, verify in pending:
        attempt(steps, lambda: (work.wait(), verify()))
    attempt(steps, dist.barrier)
