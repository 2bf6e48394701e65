"""The CUDA ops (torch.ops.fastpar.*, dispatched on CUDA tensors) against a
pure-torch reference.

Most tests need a GPU and skip without one; the build tests at the top and
the argument-check tests marked so run on any machine. List entries are put on
devices round-robin (devs(n): entry i on GPU i % NGPU), so on one GPU the whole
matrix runs with every entry on cuda:0 (repeated devices: each entry its own
buffer, one kernel launch for the allreduce), and on 2+ GPUs it mixes peer
reads with repeated devices. The peer-access and staging variants (pairs of
distinct devices, allocator peer grants) need 2+ GPUs.

Reference semantics (core/kernels/reduce_ops.h): sources are combined in list order
0..n-1, 16-bit floats accumulate in float32 and round once at the end, AVG
divides the full reduction by n, integers wrap. The one-pass kernels (direct
allreduce, reduce, reduce_scatter) follow exactly that order, so they must
match the reference bit for bit, random data included. The ring starts each
segment's sum at a different rank; it is compared bit for bit with the CPU
ring (the same schedule and segment cut) and, on exact integer-valued data,
with the reference.

The matrices are covering arrays, not full products (covering.py): every
pair of values of any two parameters (list length, dtype, op, size class,
storage offset, algorithm or output kind) is in some case, plus seeded random
cases; the full products were 20,557 cases (9-10 minutes on one GPU), these
are under 2,000 (under a minute). Case ids name every value, so a failure
reruns by its id.
"""
import itertools

import pytest
import torch

import fastpar
from covering import covering

ops = torch.ops.fastpar

NGPU = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_gpu = pytest.mark.skipif(NGPU < 1, reason="needs a CUDA device")
needs_gpus = pytest.mark.skipif(NGPU < 2, reason="needs at least 2 CUDA devices")

SUM, AVG, PRODUCT, MIN, MAX = 0, 1, 2, 3, 4
OPS = [SUM, AVG, PRODUCT, MIN, MAX]
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
DTYPES = FLOATS + INTS
# BIG: 1 MiB of float32, many blocks and a ragged tail; 2**20 + 3 made the
# CPU references alone take minutes of the GPU check's budget.
BIG = 2**18 + 3
SIZES = [0, 1, 3, 7, 8, 15, 16, 17, 1000, BIG]
ALGORITHMS = ["auto", "direct", "ring"]
# List lengths worth covering: 2 (the ring's finish step reads raw data), an
# odd count, and 8 (the direct kernel's source limit) or every GPU when more.
NS = sorted({2, 3, max(8, NGPU)})


def devs(n):
    """The device of each of n list entries: round-robin over the GPUs, so one
    GPU holds them all ([0, 0, ...]) and 2+ GPUs mix distinct and repeated."""
    return [i % max(NGPU, 1) for i in range(n)]
# Storage offsets: 0 keeps every pointer 16-byte aligned (the uint4 path), 1
# element misaligns them (the scalar path).
OFFSETS = [0, 1]


OP_IDS = {SUM: "SUM", AVG: "AVG", PRODUCT: "PRODUCT", MIN: "MIN", MAX: "MAX"}


def _id(name, v):
    if isinstance(v, torch.dtype):
        return str(v).replace("torch.", "")
    if name == "op":
        return OP_IDS[v]
    return f"{name}{v}" if isinstance(v, (int, bool)) else str(v)


def matrix(random_count, seed, **factors):
    """pytest params for a covering array of `factors` (every pair of values
    of any two, plus `random_count` seeded random cases), in the order the
    factors are named, with ids naming every value."""
    rows = covering(factors, random_count, seed)
    return [pytest.param(*r.values(), id="-".join(_id(k, v) for k, v in r.items())) for r in rows]


def all_peer(devices):
    return all(a == b or torch.cuda.can_device_access_peer(a, b) for a in devices for b in devices)


def exact_data(n, size, dtype, op, seed):
    """Integer-valued inputs whose reduction is exact in every order (so any
    schedule must reproduce the reference bit for bit)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        if op == PRODUCT:
            # Products of {-1, 1, 2} over <= 8 tensors fit every dtype exactly
            # (uint8 gets {1, 2}); int overflow would wrap identically anyway.
            choices = torch.tensor([1, 2] if dtype == torch.uint8 else [-1, 1, 2])
            v = choices[torch.randint(0, len(choices), (size,), generator=g)]
        elif dtype == torch.uint8:
            v = torch.randint(0, 16, (size,), generator=g)
        else:
            v = torch.randint(-8, 9, (size,), generator=g)
        out.append(v.to(dtype))
    return out


def random_data(n, size, dtype, op, seed):
    """Inputs whose float reductions round (order matters): for the one-pass
    kernels, which must still match the in-order reference exactly."""
    if dtype not in FLOATS:
        return exact_data(n, size, dtype, op, seed)
    g = torch.Generator().manual_seed(seed)
    if op == PRODUCT:
        return [(1 + 0.1 * torch.randn(size, generator=g, dtype=torch.float64)).to(dtype) for _ in range(n)]
    return [torch.randn(size, generator=g, dtype=torch.float64).mul(100).to(dtype) for _ in range(n)]


def reference(inputs, op):
    """In-order reduction with reduce_ops.h's accumulator types, on the CPU."""
    dtype = inputs[0].dtype
    acc_dtype = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    acc = inputs[0].cpu().to(acc_dtype)
    for t in inputs[1:]:
        t = t.cpu().to(acc_dtype)
        if op in (SUM, AVG):
            acc = acc + t
        elif op == PRODUCT:
            acc = acc * t
        elif op == MIN:
            acc = torch.minimum(acc, t)
        else:
            acc = torch.maximum(acc, t)
    if op == AVG and dtype in FLOATS:
        acc = acc / len(inputs)
    elif op == AVG:  # NCCL's: the wrapped sum, divided truncating toward zero
        acc = torch.div(acc.to(torch.int64), len(inputs), rounding_mode="trunc")
    return acc.to(dtype)


def on_device(t, device, offset):
    """A contiguous copy of `t` on `device` starting `offset` elements into its
    storage (offset 1 breaks 16-byte alignment)."""
    buf = torch.empty(t.numel() + offset, dtype=t.dtype, device=device)
    view = buf[offset:]
    view.copy_(t)
    assert view.storage_offset() == offset and view.is_contiguous()
    return view


def assert_bitwise(actual, expected):
    actual = actual.cpu()
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.equal(actual.view(-1).view(torch.uint8), expected.view(-1).view(torch.uint8)), (
        f"not bitwise equal: max abs diff {(actual.double() - expected.double()).abs().max().item()}"
    )


@pytest.fixture(params=[False, True], ids=["launch_per_segment", "one_launch"])
def small_ring_segments(request):
    """64-byte ring segments: a few hundred elements already cross many
    windows, the multi-window path; each ring test runs in both one-GPU forms
    (one launch per segment, the default; one launch a call); restored afterwards."""
    old = fastpar._C._testing.ring_segment_bytes(), fastpar._C._testing.ring_one_launch()
    fastpar._C._testing.set_ring_segment_bytes(64)
    fastpar._C._testing.set_ring_one_launch(request.param)
    yield
    fastpar._C._testing.set_ring_segment_bytes(old[0])
    fastpar._C._testing.set_ring_one_launch(old[1])


def test_ring_one_launch_is_opt_in():
    # The one-launch form has run in the host emulation only: off by default.
    assert fastpar._C._testing.ring_one_launch() is False


# ------------------------------------------------------------------ the build

OP_NAMES = ["allreduce_", "reduce_", "reduce_scatter_", "allgather_", "broadcast_", "copy_many_"]


def cuda_kernels_registered():
    return [torch._C._dispatch_has_kernel_for_dispatch_key(f"fastpar::{n}", "CUDA") for n in OP_NAMES]


def test_built_with_cuda_matches_registered_kernels():
    """A CUDA build says so and registers a CUDA kernel for every op; a
    CPU-only build registers none (and the test skips)."""
    registered = cuda_kernels_registered()
    if not fastpar._C.built_with_cuda and not any(registered):
        pytest.skip("CPU-only build of fastpar")
    assert fastpar._C.built_with_cuda is True
    assert all(registered), dict(zip(OP_NAMES, registered))


def test_cpu_ops_unchanged_in_any_build():
    ts = [torch.arange(5, dtype=torch.float32) * (i + 1) for i in range(3)]
    ops.allreduce_(ts, SUM, "auto")
    for t in ts:
        assert torch.equal(t, torch.arange(5, dtype=torch.float32) * 6)


# -------------------------------------------------------------------- allreduce


def allreduce_matches_reference(inputs, op, algorithm, offset):
    """inputs[d] goes to GPU d; after the allreduce every GPU holds the
    in-order reference, bit for bit."""
    tensors = [on_device(t, d, offset) for d, t in zip(devs(len(inputs)), inputs)]
    ops.allreduce_(tensors, op, algorithm)
    expected = reference(inputs, op)
    for t in tensors:
        assert_bitwise(t, expected)


@needs_gpu
@pytest.mark.parametrize("n,dtype,op,size,algorithm,offset", matrix(
    250, 1, n=NS, dtype=DTYPES, op=OPS, size=SIZES, algorithm=ALGORITHMS, offset=OFFSETS))
def test_allreduce_exact(n, dtype, op, size, algorithm, offset):
    devices = devs(n)
    if algorithm == "direct" and not all_peer(devices):
        pytest.skip("no peer access between every pair (see test_allreduce_direct_needs_peer_access)")
    allreduce_matches_reference(exact_data(n, size, dtype, op, seed=size * 31 + op), op, algorithm, offset)


@needs_gpu
@pytest.mark.parametrize("n,dtype,op,size,offset", matrix(
    80, 2, n=NS, dtype=DTYPES, op=OPS, size=[17, 1000, BIG], offset=OFFSETS))
def test_allreduce_direct_random_is_in_order(n, dtype, op, size, offset):
    devices = devs(n)
    if not all_peer(devices):
        pytest.skip("no peer access between every pair")
    allreduce_matches_reference(random_data(n, size, dtype, op, seed=7), op, "direct", offset)


@needs_gpu
@pytest.mark.parametrize("n,dtype,op,size,offset", matrix(
    80, 3, n=NS, dtype=DTYPES, op=OPS, size=[1, 17, 1000, 4099], offset=OFFSETS))
def test_allreduce_ring_random_matches_cpu_ring(n, dtype, op, size, offset, small_ring_segments):
    """Same schedule, same segment cut, same element math: the CUDA ring and
    the CPU ring give the same bits, and every GPU holds the same bits."""
    inputs = random_data(n, size, dtype, op, seed=11)
    on_cpu = [t.clone() for t in inputs]
    ops.allreduce_(on_cpu, op, "ring")
    tensors = [on_device(t, d, offset) for t, d in zip(inputs, devs(n))]
    ops.allreduce_(tensors, op, "ring")
    for t in tensors:
        assert_bitwise(t, on_cpu[0])
    if dtype in FLOATS and op != PRODUCT:
        tol = {torch.float16: 1e-2, torch.bfloat16: 1e-1}.get(dtype, 1e-5)
        torch.testing.assert_close(tensors[0].cpu().double(), reference(inputs, op).double(), rtol=tol, atol=tol * 100)


@needs_gpu
@pytest.mark.parametrize("n,dtype,op", matrix(30, 4, n=NS, dtype=DTYPES, op=OPS))
def test_allreduce_ring_many_windows_exact(n, dtype, op, small_ring_segments):
    inputs = exact_data(n, 5000, dtype, op, seed=3)
    tensors = [on_device(t, d, 0) for t, d in zip(inputs, devs(n))]
    ops.allreduce_(tensors, op, "ring")
    for t in tensors:
        assert_bitwise(t, reference(inputs, op))


@needs_gpus
def test_allreduce_direct_needs_peer_access():
    devices = list(range(NGPU))
    ts = [torch.ones(10, device=d) for d in devices]
    if all_peer(devices):
        ops.allreduce_(ts, SUM, "direct")
        assert all(torch.equal(t.cpu(), torch.full((10,), float(NGPU))) for t in ts)
    else:
        with pytest.raises(ValueError, match="algorithm 'direct' needs peer access between every pair"):
            ops.allreduce_(ts, SUM, "direct")


@needs_gpu
def test_allreduce_orders_against_current_streams():
    """Producers on a non-default current stream, no synchronize before the
    op, consumers right after it on the same streams: the op (side streams
    across devices, the current stream on one) must wait for the first and be
    waited on by the second."""
    n = max(NGPU, 2)
    ds = devs(n)
    streams = {d: torch.cuda.Stream(device=d) for d in set(ds)}
    size = 2**22
    ts = []
    for i, d in enumerate(ds):
        with torch.cuda.device(d), torch.cuda.stream(streams[d]):
            t = torch.empty(size, device=d)
            torch.cuda._sleep(10_000_000)  # make the producer slow
            t.fill_(i + 1)
            ts.append(t)
    total = float(sum(range(1, n + 1)))
    for algorithm, expected in (("auto", total), ("ring", total * n)):
        # The op orders itself against the current stream of every device.
        previous = [torch.cuda.current_stream(d) for d in streams]
        for s in streams.values():
            torch.cuda.set_stream(s)
        try:
            ops.allreduce_(ts, SUM, algorithm)
            outs = [t * 1 for t in ts]  # consumers on the current streams
        finally:
            for s in previous:
                torch.cuda.set_stream(s)
        torch.cuda.synchronize()
        for o in outs:
            assert torch.equal(o.cpu(), torch.full((size,), expected))


@needs_gpu
def test_reduce_scatter_gather_broadcast_order_against_current_streams():
    """As the allreduce above, for reduce, reduce_scatter, allgather and
    broadcast: inputs made by a slow producer on a non-default current
    stream, outputs read right after the op on the same streams."""
    n = max(NGPU, 2)
    ds = devs(n)
    streams = {d: torch.cuda.Stream(device=d) for d in set(ds)}
    size = 2**20 * n
    previous = [torch.cuda.current_stream(d) for d in streams]
    for s in streams.values():
        torch.cuda.set_stream(s)
    try:
        ins = []
        for i, d in enumerate(ds):
            with torch.cuda.device(d):
                t = torch.empty(size, device=d)
                torch.cuda._sleep(10_000_000)  # make the producer slow
                t.fill_(i + 1)
                ins.append(t)
        total = float(sum(range(1, n + 1)))
        reduced = torch.empty(size, device=ds[-1])
        ops.reduce_(ins, reduced, SUM)
        shards = [torch.empty(size // n, device=d) for d in ds]
        ops.reduce_scatter_(ins, shards, SUM)
        gathered = [torch.empty(size * n, device=d) for d in ds]
        ops.allgather_(ins, gathered)
        copies = [torch.empty(size, device=d) for d in ds]
        ops.broadcast_(ins[0], copies)
        outs = [reduced * 1, *(s * 1 for s in shards), *(g * 1 for g in gathered), *(c * 1 for c in copies)]
    finally:
        for s in previous:
            torch.cuda.set_stream(s)
    torch.cuda.synchronize()
    expected_gather = torch.cat([torch.full((size,), float(i + 1)) for i in range(n)])
    assert torch.equal(outs[0].cpu(), torch.full((size,), total))
    for o in outs[1:1 + n]:
        assert torch.equal(o.cpu(), torch.full((size // n,), total))
    for o in outs[1 + n:1 + 2 * n]:
        assert torch.equal(o.cpu(), expected_gather)
    for o in outs[1 + 2 * n:]:
        assert torch.equal(o.cpu(), torch.full((size,), 1.0))


@needs_gpu
def test_allreduce_single_tensor_is_identity():
    t = torch.arange(10, dtype=torch.float32, device=0)
    for algorithm in ALGORITHMS:
        ops.allreduce_([t], AVG, algorithm)
        assert torch.equal(t.cpu(), torch.arange(10, dtype=torch.float32))


@needs_gpu
@pytest.mark.parametrize("destination", [-1, "cpu"])
def test_reduce_add_to_the_cpu_as_torch_cuda_comm(destination):
    """torch.cuda.comm.reduce_add(inputs, destination=-1) puts the sum on the CPU."""
    xs = [torch.arange(1000, dtype=torch.float32, device=0) * (i + 1) for i in range(3)]
    got = fastpar.reduce_add(xs, destination)
    assert got.device == torch.device("cpu")
    assert torch.equal(got, torch.arange(1000, dtype=torch.float32) * 6)
    got = fastpar.reduce_add_coalesced([[x, x[:10]] for x in xs], destination)
    assert all(g.device == torch.device("cpu") for g in got)
    assert torch.equal(got[1], torch.arange(10, dtype=torch.float32) * 6)


# ---------------------------------------------------------- reduce, reduce_scatter


@needs_gpu
@pytest.mark.parametrize("n,dtype,op,size,offset,output_kind", matrix(
    200, 5, n=NS, dtype=DTYPES, op=OPS, size=SIZES, offset=OFFSETS,
    output_kind=["root_in_place", "separate_on_root", "separate_elsewhere"]))
def test_reduce(n, dtype, op, size, offset, output_kind):
    inputs = random_data(n, size, dtype, op, seed=size + 5)
    tensors = [on_device(t, d, offset) for t, d in zip(inputs, devs(n))]
    if output_kind == "root_in_place":
        output = tensors[n - 1]
    elif output_kind == "separate_on_root":
        output = on_device(torch.zeros(size, dtype=dtype), 0, 1 - offset)
    else:
        output = on_device(torch.zeros(size, dtype=dtype), devs(n)[-1], offset)
    ops.reduce_(tensors, output, op)
    assert_bitwise(output, reference(inputs, op))
    if output_kind != "root_in_place":
        for t, i in zip(tensors, inputs):
            assert_bitwise(t, i)  # inputs untouched


@needs_gpu
@pytest.mark.parametrize("n,dtype,op,size,offset,in_place", matrix(
    200, 6, n=NS, dtype=DTYPES, op=OPS, size=SIZES, offset=OFFSETS, in_place=[False, True]))
def test_reduce_scatter(n, dtype, op, size, offset, in_place):
    inputs = random_data(n, n * size, dtype, op, seed=size + 9)
    tensors = [on_device(t, d, offset) for t, d in zip(inputs, devs(n))]
    if in_place:  # outputs[i] is slice i of inputs[i], as reduce_scatter's users do
        outputs = [tensors[i][i * size:(i + 1) * size] for i in range(n)]
    else:
        outputs = [on_device(torch.zeros(size, dtype=dtype), d, 1 - offset) for d in devs(n)]
    ops.reduce_scatter_(tensors, outputs, op)
    for i, out in enumerate(outputs):
        assert_bitwise(out, reference([t[i * size:(i + 1) * size] for t in inputs], op))


# ---------------------------------------------------- allgather, broadcast, copies


@needs_gpu
@pytest.mark.parametrize("n,dtype,size,offset,in_place", matrix(
    120, 7, n=NS, dtype=DTYPES, size=SIZES, offset=OFFSETS, in_place=[False, True]))
def test_allgather(n, dtype, size, offset, in_place):
    inputs = exact_data(n, size, dtype, SUM, seed=size + 13)
    outputs = [on_device(torch.zeros(n * size, dtype=dtype), d, offset) for d in devs(n)]
    if in_place:
        tensors = [outputs[i][i * size:(i + 1) * size] for i in range(n)]
        for t, i in zip(tensors, inputs):
            t.copy_(i)
    else:
        tensors = [on_device(t, d, 1 - offset) for t, d in zip(inputs, devs(n))]
    ops.allgather_(tensors, outputs)
    expected = torch.cat(inputs)
    for out in outputs:
        assert_bitwise(out, expected)


@needs_gpu
@pytest.mark.parametrize("dtype,size,source,offset", matrix(
    120, 8, dtype=DTYPES, size=SIZES, source=["cuda_in_place", "cuda_other", "cpu", "cpu_pinned"], offset=OFFSETS))
def test_broadcast(dtype, size, source, offset):
    data = exact_data(1, size, dtype, SUM, seed=size)[0]
    outputs = [on_device(torch.zeros(size, dtype=dtype), d, offset) for d in devs(max(NGPU, 3))]
    if source == "cuda_in_place":
        outputs[0].copy_(data)
        src = outputs[0]
    elif source == "cuda_other":
        src = on_device(data, devs(max(NGPU, 3))[-1], 1 - offset)
        outputs = outputs[:-1]
    elif source == "cpu":
        src = data.clone()
    else:
        src = data.clone().pin_memory()
    ops.broadcast_(src, outputs)
    for out in outputs:
        assert_bitwise(out, data)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8, torch.int64])
@pytest.mark.parametrize("size", [0, 1, 17, 2**20 + 3])
def test_copy_many_scatter_and_gather(dtype, size):
    n = max(NGPU, 3)
    full = exact_data(1, n * size + 3, dtype, SUM, seed=1)[0]  # unequal chunks
    for src_device in ("cpu", 0):
        src = full.to(src_device)
        chunks = list(torch.tensor_split(src, n))
        dsts = [torch.empty(c.shape, dtype=dtype, device=d) for c, d in zip(chunks, devs(n))]
        ops.copy_many_(chunks, dsts)
        for c, d in zip(chunks, dsts):
            assert_bitwise(d, c.cpu())
        # gather back, to a CUDA tensor and to a CPU one
        for dst_device in (0, "cpu"):
            out = torch.empty_like(full, device=dst_device)
            views = list(out.split([c.numel() for c in chunks]))
            ops.copy_many_(dsts, views)
            assert_bitwise(out, full)


@needs_gpu
def test_copy_many_strided_gather_along_dim_1():
    n = max(NGPU, 3)
    parts = [torch.arange(12, dtype=torch.float32, device=d).view(3, 4) + 100 * i for i, d in enumerate(devs(n))]
    out = torch.empty(3, 4 * n, device=0)
    views = list(out.split(4, dim=1))  # not contiguous
    ops.copy_many_(parts, views)
    assert torch.equal(out.cpu(), torch.cat([p.cpu() for p in parts], dim=1))


# ---------------------------------------------------------------------- errors


def error_of(fn):
    with pytest.raises(Exception) as info:
        fn()
    return type(info.value), str(info.value).split("\n")[0]


@needs_gpu
def test_errors_match_cpu_backend():
    """The same mistake gives the same exception and message on both backends."""
    cases = [
        lambda dev: ops.allreduce_([torch.ones(3, device=dev), torch.ones(4, device=dev if dev == "cpu" else 0)], SUM, "auto"),
        lambda dev: ops.allreduce_([torch.ones(3, device=dev), torch.ones(3, dtype=torch.float16, device=dev if dev == "cpu" else 0)], SUM, "auto"),
        lambda dev: ops.allreduce_([torch.ones(3, device=dev)], SUM, "tree"),
        lambda dev: ops.allreduce_([torch.ones(3, device=dev)], 7, "auto"),
        lambda dev: ops.allreduce_([torch.ones(3, 2, device=dev).t()], SUM, "auto"),
        lambda dev: ops.reduce_([torch.ones(3, device=dev)], torch.ones(4, device=dev), SUM),
        lambda dev: ops.reduce_scatter_([torch.ones(6, device=dev)], [torch.ones(3, device=dev)], SUM),
        lambda dev: ops.allgather_([torch.ones(3, device=dev)], [torch.ones(4, device=dev)]),
        lambda dev: ops.broadcast_(torch.ones(3, device=dev), [torch.ones(4, device=dev)]),
        lambda dev: ops.copy_many_([torch.ones(3, device=dev)], [torch.ones(4, device=dev)]),
        lambda dev: ops.copy_many_([torch.ones(3, device=dev)], [torch.ones(3, dtype=torch.float64, device=dev)]),
        lambda dev: ops.broadcast_(torch.ones(3, dtype=torch.float16, device=dev), [torch.ones(3, device=dev)]),
        lambda dev: ops.allgather_([torch.ones(3, device=dev)], [torch.ones(6, device=dev)]),
    ]
    for case in cases:
        assert error_of(lambda: case("cpu")) == error_of(lambda: case(0))


@needs_gpu
def test_errors_cuda_specific():
    with pytest.raises(ValueError, match=r"tensors\[1\] overlaps tensors\[0\] in memory \(both on device 'cuda:0'\)"):
        t = torch.ones(3, device=0)
        ops.allreduce_([t, t], SUM, "auto")
    with pytest.raises(ValueError, match=r"all tensors must be CPU tensors or all CUDA tensors"):
        ops.allreduce_([torch.ones(3, device=0), torch.ones(3)], SUM, "auto")
    with pytest.raises(TypeError, match=r"tensor has dtype torch\.(float16|Half) but outputs\[0\] has dtype torch\.(float32|Float)"):
        ops.broadcast_(torch.ones(3, dtype=torch.float16), [torch.ones(3, device=0)])


@needs_gpu
def test_overlapping_written_entries_are_refused_read_only_may_repeat():
    """Entries of a list the op writes must not share bytes (the result would
    depend on write order); read-only inputs may repeat; distinct buffers on one
    device are fine."""
    buf = torch.zeros(8, device=0)
    with pytest.raises(ValueError, match=r"fastpar.allreduce: tensors\[1\] overlaps tensors\[0\]"):
        ops.allreduce_([buf[0:4], buf[2:6]], SUM, "direct")
    with pytest.raises(ValueError, match=r"fastpar.allgather: outputs\[2\] overlaps outputs\[0\]"):
        ops.allgather_([torch.ones(1, device=0)] * 3, [buf[0:3], buf[5:8], buf[1:4]])
    a, b = buf[0:4], buf[4:8]  # adjacent, not overlapping
    a.fill_(1)
    b.fill_(2)
    ops.allreduce_([a, b], SUM, "direct")
    assert torch.equal(buf.cpu(), torch.full((8,), 3.0))
    x = torch.arange(4.0, device=0)
    out = torch.empty(4, device=0)
    ops.reduce_([x, x, x], out, SUM)  # an input read three times
    assert torch.equal(out.cpu(), torch.arange(4.0) * 3)


@needs_gpu
def test_more_than_eight_entries():
    ts = [torch.ones(10, device=d) for d in devs(max(NGPU, 9))]
    n = len(ts)
    ops.allreduce_(ts, SUM, "auto")  # falls to the ring, which has no limit
    assert all(torch.equal(t.cpu(), torch.full((10,), float(n))) for t in ts)
    with pytest.raises(ValueError, match="at most 8"):
        ops.allreduce_(ts, SUM, "direct")
    with pytest.raises(ValueError, match="at most 8"):
        ops.reduce_(ts, ts[0], SUM)


@needs_gpus
def test_every_pair_of_devices():
    """Each ordered pair once, for machines whose pairs differ (NVLink on some,
    PCIe without P2P on others): staging and peer reads must agree."""
    for a, b in itertools.permutations(range(NGPU), 2):
        inputs = random_data(2, 1000, torch.float16, SUM, seed=a * 8 + b)
        for algorithm in ("auto", "ring"):
            ts = [on_device(inputs[0], a, 0), on_device(inputs[1], b, 1)]
            ops.allreduce_(ts, SUM, algorithm)
            assert_bitwise(ts[0], reference(inputs, SUM))
            assert_bitwise(ts[1], ts[0].cpu())


# ------------------------------------------ the distinct-GPU branches, on one GPU
#
# A test device model (fastpar._C._testing.set_list_device_model, csrc/torch/ops/tuning.h)
# takes every list entry to be on a GPU of its own: side streams and events as
# across GPUs, and peer reads in place ("distinct_peer") or staging copies
# ("distinct_staging"). On one GPU these are the branches that would otherwise
# first run on several; the results must be the real model's bits.

DISTINCT_MODELS = ["distinct_peer", "distinct_staging"]
# On several GPUs the tests above run the real branches; the paths counted
# below assume every entry on cuda:0.
one_gpu = pytest.mark.skipif(NGPU != 1, reason="the device models stand in for several GPUs on one")


@pytest.fixture(params=DISTINCT_MODELS)
def distinct_model(request):
    old = fastpar._C._testing.list_device_model()
    fastpar._C._testing.set_list_device_model(request.param)
    yield request.param
    fastpar._C._testing.set_list_device_model(old)


def test_list_device_model_is_real_by_default_and_checked():
    assert fastpar._C._testing.list_device_model() == "real"
    with pytest.raises(ValueError, match="model must be one of 'real', 'distinct_peer', 'distinct_staging', got 'fake'"):
        fastpar._C._testing.set_list_device_model("fake")
    assert fastpar._C._testing.list_device_model() == "real"
    assert set(fastpar._C._list_op_paths()) == {"allreduce_one_launch", "allreduce_direct", "allreduce_ring",
                                                "staging_buffers"}


def paths_delta(fn):
    before = fastpar._C._list_op_paths()
    fn()
    after = fastpar._C._list_op_paths()
    return {k: after[k] - before[k] for k in after}


@needs_gpu
@one_gpu
@pytest.mark.parametrize("n,dtype,op,size,algorithm,offset", matrix(
    10, 10, n=NS, dtype=DTYPES, op=OPS, size=[1, 17, 1000, BIG], algorithm=ALGORITHMS, offset=OFFSETS))
def test_allreduce_as_distinct_devices(n, dtype, op, size, algorithm, offset, distinct_model):
    """Every entry on cuda:0, taken as its own GPU: 'auto' and 'direct' run a
    kernel per shard on side streams (with peer access) or fall to the ring
    (without: 'direct' is refused by name); the ring runs each rank on a
    stream of its own with accumulators and, without peer access, staging
    buffers. The bits are the reference's."""
    inputs = exact_data(n, size, dtype, op, seed=size * 37 + op)
    tensors = [on_device(t, 0, offset) for t in inputs]
    if algorithm == "direct" and distinct_model == "distinct_staging":
        with pytest.raises(ValueError, match="algorithm 'direct' needs peer access between every pair of devices, "
                                             "but cuda:0 cannot access cuda:0"):
            ops.allreduce_(tensors, op, algorithm)
        return
    delta = paths_delta(lambda: ops.allreduce_(tensors, op, algorithm))
    for t in tensors:
        assert_bitwise(t, reference(inputs, op))
    assert delta["allreduce_one_launch"] == 0
    ring = algorithm == "ring" or distinct_model == "distinct_staging"
    assert delta["allreduce_ring" if ring else "allreduce_direct"] == 1, delta
    if ring and distinct_model == "distinct_staging":
        assert delta["staging_buffers"] == n, delta


@needs_gpu
@one_gpu
@pytest.mark.parametrize("n,dtype,op,size", matrix(2, 13, n=NS, dtype=DTYPES, op=OPS, size=[4099]))
def test_ring_as_distinct_devices_across_many_windows(n, dtype, op, size, distinct_model, small_chunks):
    """64-byte segments: the ring with a stream per rank crosses tens of
    windows, so each window's accumulators are reused while other ranks'
    streams may still read the last window's (the events between the ranks'
    streams order it). The bits are the reference's."""
    inputs = exact_data(n, size, dtype, op, seed=size * 41 + op)
    tensors = [on_device(t, 0, 0) for t in inputs]
    delta = paths_delta(lambda: ops.allreduce_(tensors, op, "ring"))
    for t in tensors:
        assert_bitwise(t, reference(inputs, op))
    assert delta["allreduce_ring"] == 1 and delta["allreduce_one_launch"] == 0, delta


@needs_gpu
@one_gpu
@pytest.mark.parametrize("n,dtype,op,size,offset", matrix(
    6, 11, n=NS, dtype=DTYPES, op=OPS, size=[1, 17, 1000, BIG], offset=OFFSETS))
def test_reduce_and_reduce_scatter_as_distinct_devices(n, dtype, op, size, offset, distinct_model):
    """Without peer access every input is read through a staging copy on the
    output's GPU (n for a reduce, n x n for a reduce_scatter); with it, none.
    The bits are the real model's (the same tests' checks)."""
    staged = distinct_model == "distinct_staging"
    delta = paths_delta(lambda: test_reduce(n, dtype, op, size, offset, "separate_elsewhere"))
    assert delta["staging_buffers"] == (n if staged else 0), delta
    delta = paths_delta(lambda: test_reduce_scatter(n, dtype, op, size, offset, False))
    assert delta["staging_buffers"] == (n * n if staged else 0), delta


@needs_gpu
@pytest.mark.parametrize("n,dtype,size,offset", matrix(
    4, 12, n=NS, dtype=DTYPES, size=[1, 17, 1000, BIG], offset=OFFSETS))
def test_copies_as_distinct_devices(n, dtype, size, offset, distinct_model):
    """allgather and broadcast on side streams with events, as across GPUs:
    the real model's results."""
    test_allgather(n, dtype, size, offset, False)
    test_broadcast(dtype, size, "cuda_other", offset)
    test_broadcast(dtype, size, "cpu", offset)


@needs_gpu
def test_side_streams_order_as_distinct_devices(distinct_model):
    """The ops' side streams wait for the current stream's producers and are
    waited on by its consumers, with every entry taken as its own GPU."""
    test_allreduce_orders_against_current_streams()
    test_reduce_scatter_gather_broadcast_order_against_current_streams()
    test_copy_many_scatter_and_gather(torch.float32, 2**20 + 3)


@needs_gpu
def test_opcheck_schema_on_cuda():
    """The CUDA kernels honour the schemas' mutation annotations (what they
    write is declared Tensor(a!), what they only read is not touched)."""
    from torch.library import opcheck

    n = max(NGPU, 3)
    ds = devs(n)
    cases = [
        (ops.allreduce_.default, ([torch.randn(10, device=d) for d in ds], SUM, "auto")),
        (ops.allreduce_.default, ([torch.randn(10, device=d) for d in ds], AVG, "ring")),
        (ops.reduce_.default, ([torch.randn(10, device=d) for d in ds], torch.empty(10, device=0), SUM)),
        (ops.reduce_scatter_.default,
         ([torch.randn(2 * n, device=d) for d in ds], [torch.empty(2, device=d) for d in ds], SUM)),
        (ops.allgather_.default,
         ([torch.randn(2, device=d) for d in ds], [torch.empty(2 * n, device=d) for d in ds])),
        (ops.broadcast_.default, (torch.randn(4, device=0), [torch.empty(4, device=d) for d in ds])),
        (ops.broadcast_.default, (torch.randn(4), [torch.empty(4, device=d) for d in ds])),
        (ops.copy_many_.default, ([torch.randn(4, device=d) for d in ds], [torch.empty(4, device=0) for _ in ds])),
    ]
    for op, args in cases:
        assert opcheck(op, args, test_utils="test_schema") == {"test_schema": "SUCCESS"}


EXPANDABLE_SCRIPT = r"""
import torch, fastpar
n = torch.cuda.device_count()
for algorithm in ("auto", "ring"):
    ts = [torch.full((1 << 20,), float(d + 1), device=d) for d in range(n)]
    torch.ops.fastpar.allreduce_(ts, 0, algorithm)
    out = torch.empty(1 << 20, device=0)
    torch.ops.fastpar.reduce_(ts, out, 0)
    torch.cuda.synchronize()
    total = float(sum(range(1, n + 1)))
    assert all(torch.equal(t.cpu(), torch.full((1 << 20,), total)) for t in ts), algorithm
    assert torch.equal(out.cpu(), torch.full((1 << 20,), total * n)), algorithm
print("ok")
"""


@needs_gpus
@pytest.mark.parametrize("alloc_conf", ["expandable_segments:True", "backend:cudaMallocAsync"])
def test_peer_reads_with_other_allocator_configurations(alloc_conf):
    """Expandable segments and cudaMallocAsync map memory per device: the ops
    must grant peers access through the allocator, or the direct kernels fault."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=alloc_conf)
    run = subprocess.run([sys.executable, "-c", EXPANDABLE_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0 and "ok" in run.stdout, run.stdout + run.stderr[-4000:]


# ---------------------------------------------------------- CUDA graph capture

GRAPH_CASES = ["allreduce_direct", "allreduce_auto", "allreduce_ring", "reduce", "reduce_scatter", "allgather",
               "broadcast", "copy_many"]


def capture(fn):
    """fn captured into a CUDA graph, after one eager warm-up run on a side
    stream (what torch.cuda.graph's docs ask for: lazy initialisation such as
    the SM-count and peer-access caches happens outside the capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


@needs_gpu
@pytest.mark.parametrize("case", GRAPH_CASES)
@pytest.mark.parametrize("n", [2, 3, 8])
def test_cuda_graph_capture_and_replay(case, n):
    """Every list op, all entries on cuda:0, captured once and replayed on new
    inputs: the replay gives what the eager op gives (the reference)."""
    m = 1027  # odd: the 16-byte packs plus a scalar tail
    dt = torch.float32
    dev = 0
    if case.startswith("allreduce"):
        ts = [torch.empty(m, dtype=dt, device=dev) for _ in range(n)]
        inputs_of = lambda seed: exact_data(n, m, dt, SUM, seed)
        load = lambda xs: [t.copy_(x) for t, x in zip(ts, xs)]
        fn = lambda: ops.allreduce_(ts, SUM, case.split("_")[1])
        results = lambda xs: [(t, reference(xs, SUM)) for t in ts]
    elif case == "reduce":
        ts = [torch.empty(m, dtype=dt, device=dev) for _ in range(n)]
        out = torch.empty(m, dtype=dt, device=dev)
        inputs_of = lambda seed: exact_data(n, m, dt, MAX, seed)
        load = lambda xs: [t.copy_(x) for t, x in zip(ts, xs)]
        fn = lambda: ops.reduce_(ts, out, MAX)
        results = lambda xs: [(out, reference(xs, MAX))]
    elif case == "reduce_scatter":
        ts = [torch.empty(n * m, dtype=dt, device=dev) for _ in range(n)]
        outs = [torch.empty(m, dtype=dt, device=dev) for _ in range(n)]
        inputs_of = lambda seed: exact_data(n, n * m, dt, SUM, seed)
        load = lambda xs: [t.copy_(x) for t, x in zip(ts, xs)]
        fn = lambda: ops.reduce_scatter_(ts, outs, SUM)
        results = lambda xs: [(o, reference([x[i * m:(i + 1) * m] for x in xs], SUM)) for i, o in enumerate(outs)]
    elif case == "allgather":
        ts = [torch.empty(m, dtype=dt, device=dev) for _ in range(n)]
        outs = [torch.empty(n * m, dtype=dt, device=dev) for _ in range(n)]
        inputs_of = lambda seed: exact_data(n, m, dt, SUM, seed)
        load = lambda xs: [t.copy_(x) for t, x in zip(ts, xs)]
        fn = lambda: ops.allgather_(ts, outs)
        results = lambda xs: [(o, torch.cat(xs)) for o in outs]
    elif case == "broadcast":
        src = torch.empty(m, dtype=dt, device=dev)
        outs = [torch.empty(m, dtype=dt, device=dev) for _ in range(n)]
        inputs_of = lambda seed: exact_data(1, m, dt, SUM, seed)
        load = lambda xs: src.copy_(xs[0])
        fn = lambda: ops.broadcast_(src, outs)
        results = lambda xs: [(o, xs[0]) for o in outs]
    else:  # copy_many: the device-to-device scatter / gather copies
        ts = [torch.empty(m, dtype=dt, device=dev) for _ in range(n)]
        outs = [torch.empty(m, dtype=dt, device=dev) for _ in range(n)]
        inputs_of = lambda seed: exact_data(n, m, dt, SUM, seed)
        load = lambda xs: [t.copy_(x) for t, x in zip(ts, xs)]
        fn = lambda: ops.copy_many_(ts, outs)
        results = lambda xs: [(o, x) for o, x in zip(outs, xs)]
    load(inputs_of(0))
    graph = capture(fn)
    for seed in (1, 2):  # replays see the new contents of the captured buffers
        xs = inputs_of(seed)
        load(xs)
        graph.replay()
        torch.cuda.synchronize()
        for actual, expected in results(xs):
            assert_bitwise(actual, expected)


# ------------------------------------------------- argument checks, any machine


def test_overlapping_written_entries_are_refused_without_a_gpu():
    """The overlap rule is the shared argument check: the CPU path gives the
    message the CUDA path gives (test_errors_cuda_specific), naming both indices."""
    buf = torch.zeros(8)
    with pytest.raises(ValueError, match=r"^fastpar.allreduce: tensors\[2\] overlaps tensors\[1\] in memory "
                                         r"\(both on device 'cpu'\); every entry of tensors must be its own buffer"):
        ops.allreduce_([buf[0:2], buf[2:4], buf[3:5]], SUM, "auto")
    with pytest.raises(ValueError, match=r"fastpar.reduce_scatter: outputs\[1\] overlaps outputs\[0\]"):
        ops.reduce_scatter_([torch.ones(4), torch.ones(4)], [buf[0:2], buf[0:2]], SUM)
    with pytest.raises(ValueError, match=r"fastpar.broadcast: outputs\[1\] overlaps outputs\[0\]"):
        ops.broadcast_(torch.ones(2), [buf[0:2], buf[1:3]])
    out = torch.empty(2)
    x = torch.ones(2)
    ops.reduce_([x, x], out, SUM)  # read-only inputs may repeat
    assert torch.equal(out, torch.full((2,), 2.0))
