"""allreduce, reduce, reduce_scatter on CPU tensors against the pure-torch reference:
every dtype x op, both algorithms, list lengths 1-8, sizes at the edges of the
vector width and of a chunk, views with a storage offset."""
import pytest
import torch
from torch.distributed import ReduceOp

import fastpar
from reference import DTYPES, INT_AVG_CASES, OPS, bits, make_inputs, reference

SIZES = [0, 1, 3, 7, 8, 15, 16, 17, 1000]
LENGTHS = [1, 2, 3, 5, 8]
ALGORITHMS = ["direct", "ring"]


def _cases():
    for dtype in DTYPES:
        for op in OPS:
            yield pytest.param(dtype, op, id=f"{str(dtype)[6:]}-{op.name}")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype,op", list(_cases()))
def test_allreduce_matches_reference(dtype, op, algorithm, small_chunks):
    for n in LENGTHS:
        for numel in SIZES:
            ts = make_inputs(n, numel, dtype, op)
            expected = reference(ts, op)
            fastpar.allreduce(ts, op, algorithm=algorithm)
            for i, t in enumerate(ts):
                assert torch.equal(t, expected), f"n={n} numel={numel} output {i}"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype,op", [(torch.float32, ReduceOp.SUM), (torch.bfloat16, ReduceOp.AVG),
                                      (torch.float16, ReduceOp.SUM), (torch.int64, ReduceOp.MAX)])
@pytest.mark.parametrize("n", [2, 3])
def test_allreduce_large(dtype, op, algorithm, n):
    # 2^20 + 3 elements: many parallel tasks, several default-size ring windows, a ragged tail.
    ts = make_inputs(n, 2**20 + 3, dtype, op, seed=1)
    expected = reference(ts, op)
    fastpar.allreduce(ts, op, algorithm=algorithm)
    for t in ts:
        assert torch.equal(t, expected)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allreduce_one_past_a_chunk(algorithm):
    # One element past a default ring window (n segments of 1 MiB) and past a direct task.
    n = 2
    seg = fastpar._C._testing.ring_segment_bytes() // 4
    ts = make_inputs(n, n * seg + 1, torch.float32, ReduceOp.SUM, seed=2)
    expected = reference(ts, ReduceOp.SUM)
    fastpar.allreduce(ts, algorithm=algorithm)
    assert all(torch.equal(t, expected) for t in ts)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_allreduce_outputs_are_bitwise_identical(dtype, algorithm, small_chunks):
    # Non-integer data: rounding happens, and still every output holds the same bits.
    g = torch.Generator().manual_seed(3)
    ts = [torch.randn(4099, generator=g).to(dtype) for _ in range(5)]
    fastpar.allreduce(ts, ReduceOp.AVG, algorithm=algorithm)
    for t in ts[1:]:
        assert torch.equal(bits(t), bits(ts[0]))


def test_half_types_accumulate_in_fp32():
    # 2048 + 1 + 1 in fp16: pairwise fp16 rounding would lose both ones (2049 is not
    # representable); fp32 accumulation keeps them and rounds once to 2050.
    for dtype in (torch.float16, torch.bfloat16):
        big = 2048.0 if dtype == torch.float16 else 256.0
        for algorithm in ALGORITHMS:
            ts = [torch.full((9,), big, dtype=dtype), torch.ones(9, dtype=dtype), torch.ones(9, dtype=dtype)]
            fastpar.allreduce(ts, algorithm=algorithm)
            assert ts[2][0].item() == big + 2, (dtype, algorithm)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8])
def test_allreduce_views_with_storage_offset(dtype, algorithm, small_chunks):
    # Offsets of 1..n elements: pointers that are not vector-aligned.
    n, numel = 4, 1001
    bases = [torch.zeros(numel + 8, dtype=dtype) for _ in range(n)]
    ts = [b[i + 1:i + 1 + numel] for i, b in enumerate(bases)]
    for t, src in zip(ts, make_inputs(n, numel, dtype, ReduceOp.SUM)):
        t.copy_(src)
    expected = reference([t.clone() for t in ts], ReduceOp.SUM)
    fastpar.allreduce(ts, ReduceOp.SUM, algorithm=algorithm)
    for i, (b, t) in enumerate(zip(bases, ts)):
        assert torch.equal(t, expected)
        assert not b[:i + 1].any() and not b[i + 1 + numel:].any(), "wrote outside the view"


def test_allreduce_multidim_and_out_of_place():
    ts = make_inputs(3, 24, torch.float32, ReduceOp.MAX)
    shaped = [t.reshape(2, 3, 4) for t in ts]
    outs = [torch.empty(2, 3, 4) for _ in ts]
    expected = reference(ts, ReduceOp.MAX).reshape(2, 3, 4)
    before = [t.clone() for t in shaped]
    result = fastpar.allreduce(shaped, ReduceOp.MAX, outputs=outs)
    assert result[0] is outs[0]
    assert all(torch.equal(o, expected) for o in outs)
    assert all(torch.equal(a, b) for a, b in zip(shaped, before)), "inputs must be untouched"


@pytest.mark.parametrize("dtype,op", list(_cases()))
def test_reduce_into_root_and_new_output(dtype, op):
    for n in (1, 2, 5):
        ts = make_inputs(n, 37, dtype, op)
        expected = reference(ts, op)
        others = [t.clone() for t in ts]
        root = n - 1
        fastpar.reduce(ts, root=root, op=op)
        assert torch.equal(ts[root], expected)
        assert all(torch.equal(ts[i], others[i]) for i in range(n) if i != root)
        out = torch.empty(37, dtype=dtype)
        fastpar.reduce(others, out, op=op)
        assert torch.equal(out, expected)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", list(INT_AVG_CASES), ids=lambda d: str(d)[6:])
def test_integer_avg_wraps_then_truncates_toward_zero(dtype, algorithm):
    rows, avg2, avg3 = INT_AVG_CASES[dtype]
    for n, want in ((2, avg2), (3, avg3)):
        expected = torch.tensor(want, dtype=dtype)
        ts = [torch.tensor(r, dtype=dtype) for r in rows[:n]]
        fastpar.allreduce(ts, ReduceOp.AVG, algorithm=algorithm)
        for i, t in enumerate(ts):
            assert t.tolist() == want, f"allreduce n={n} output {i}: {t.tolist()}"
        ts = [torch.tensor(r, dtype=dtype) for r in rows[:n]]
        out = torch.empty(len(want), dtype=dtype)
        fastpar.reduce(ts, out, op=ReduceOp.AVG)
        assert out.tolist() == want, f"reduce n={n}: {out.tolist()}"
        # reduce_scatter: each of n outputs gets its slice of the average.
        ts = [torch.tensor(r * n, dtype=dtype) for r in rows[:n]]
        outs = fastpar.reduce_scatter(ts, op=ReduceOp.AVG)
        assert torch.equal(torch.cat(outs), torch.cat([expected] * n)), f"reduce_scatter n={n}"


def test_reduce_add_matches_sum():
    ts = make_inputs(4, 100, torch.int32, ReduceOp.SUM)
    assert torch.equal(fastpar.reduce_add(ts, "cpu"), reference(ts, ReduceOp.SUM))


@pytest.mark.parametrize("dtype,op", list(_cases()))
def test_reduce_scatter_matches_reference(dtype, op):
    for n in (1, 2, 3, 8):
        for per in (0, 1, 7, 17):
            ts = make_inputs(n, n * per, dtype, op)
            expected = reference(ts, op)
            outs = fastpar.reduce_scatter(ts, op=op)
            for i, o in enumerate(outs):
                assert torch.equal(o, expected[i * per:(i + 1) * per]), f"n={n} per={per} out {i}"


def test_reduce_scatter_default_output_shape():
    ts = [torch.ones(6, 5) * i for i in range(3)]
    outs = fastpar.reduce_scatter(ts)
    assert [o.shape for o in outs] == [torch.Size([2, 5])] * 3
    assert torch.equal(outs[1], torch.full((2, 5), 3.0))


def test_allreduce_coalesced_many_small_tensors():
    n = 3
    shapes = [(3,), (2, 2), (1,), (5,), (0,), (4, 1)]
    per_dev = [[torch.randint(-5, 5, s).float() for s in shapes] + [torch.randint(-5, 5, (3,))]
               for _ in range(n)]
    expected = [reference([per_dev[d][j].flatten() for d in range(n)], ReduceOp.SUM).reshape(per_dev[0][j].shape)
                for j in range(len(per_dev[0]))]
    fastpar.allreduce_coalesced(per_dev, buffer_size=16)  # 16 bytes: several buckets, one per dtype run
    for d in range(n):
        for j, e in enumerate(expected):
            assert torch.equal(per_dev[d][j], e), (d, j)


def test_the_extension_entry_is_the_torch_op():
    """fastpar.allreduce calls the op through fastpar._C._allreduce_: the same
    dispatcher entry as torch.ops.fastpar.allreduce_, so the same bits and
    the same checks, word for word."""
    a = make_inputs(3, 1000, torch.bfloat16, ReduceOp.AVG, seed=3)
    b = [t.clone() for t in a]
    fastpar._C._allreduce_(a, 1, "ring")
    torch.ops.fastpar.allreduce_(b, 1, "ring")
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    bad = [torch.ones(4), torch.ones(5)]
    with pytest.raises(ValueError) as via_ops:
        torch.ops.fastpar.allreduce_(bad, 0, "auto")
    with pytest.raises(ValueError) as via_entry:
        fastpar._C._allreduce_(bad, 0, "auto")
    assert str(via_entry.value) == str(via_ops.value) and "tensors[1]" in str(via_entry.value)
    # the op is tested by identity first, by value after
    for op in (ReduceOp.MAX, ReduceOp(ReduceOp.MAX), "max", 4):
        ts = [torch.tensor([1.0, 5.0]), torch.tensor([3.0, 2.0])]
        fastpar.allreduce(ts, op)
        assert ts[0].tolist() == [3.0, 5.0], op
    with pytest.raises(TypeError, match=r"fastpar.allreduce: tensors\[1\] must be a Tensor, got int"):
        fastpar.allreduce([torch.ones(2), 3])


def test_allreduce_under_torch_compile():
    """A compiled function sees torch.ops.fastpar.allreduce_ (the Python
    entry would be opaque to the trace) and gets the same result."""
    def step(x, y):
        x2, y2 = x * 2, y * 2
        fastpar.allreduce([x2, y2])
        return x2 + 1

    x, y = torch.arange(6.0), torch.ones(6)
    compiled = torch.compile(step, backend="eager")
    assert torch.equal(compiled(x, y), step(x, y))
    assert torch.equal(compiled(x, y), x * 2 + y * 2 + 1)


def test_outputs_may_share_with_inputs_only_the_elements_they_receive():
    """In place (the output is an input, or a reduce_scatter output is its
    own slice of an input) runs; an output overlapping an input at another
    offset is refused by name before anything is written."""
    buf = torch.arange(9, dtype=torch.float32)
    other = torch.ones(8)
    with pytest.raises(ValueError, match=r"^fastpar.reduce: output overlaps inputs\[0\] in memory at its byte 4, "
                                         r"but may share only the elements it receives \(byte 0\)"):
        fastpar.reduce([buf[:-1], other], buf[1:])
    assert torch.equal(buf, torch.arange(9, dtype=torch.float32))
    ts = [torch.arange(6, dtype=torch.float32) * (i + 1) for i in range(3)]
    expected = sum(t.clone() for t in ts)
    outs = [ts[i][2 * i:2 * i + 2] for i in range(3)]  # each its own slice of an input: in place
    fastpar.reduce_scatter(ts, outs)
    assert torch.equal(torch.cat([o.clone() for o in outs]), expected)
    ts = [torch.arange(6, dtype=torch.float32) for _ in range(3)]
    shifted = [ts[0][1:3], torch.empty(2), torch.empty(2)]
    with pytest.raises(ValueError, match=r"fastpar.reduce_scatter: outputs\[0\] overlaps inputs\[0\] in memory at "
                                         r"its byte 4, but may share only the elements it receives \(byte 0\)"):
        fastpar.reduce_scatter(ts, shifted)
