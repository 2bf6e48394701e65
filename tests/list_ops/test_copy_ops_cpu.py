"""broadcast, scatter, gather, allgather (+ coalesced forms) on CPU "devices",
against torch's own cat / split / clone."""
import pytest
import torch

import fastpar
from reference import DTYPES

SIZES = [0, 1, 3, 7, 8, 15, 16, 17, 1000]


@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast_gives_separate_equal_buffers(dtype):
    for numel in SIZES + [2**20 + 3]:
        x = torch.arange(numel).to(dtype)
        outs = fastpar.broadcast(x, ["cpu"] * 3)
        assert len(outs) == 3
        for o in outs:
            assert torch.equal(o, x)
            assert o.data_ptr() != x.data_ptr() or numel == 0
        assert len({o.data_ptr() for o in outs}) == 3 or numel == 0


def test_broadcast_into_out_and_from_a_view():
    base = torch.arange(20.0).reshape(4, 5)
    view = base[:, 1:4]  # not contiguous
    outs = [torch.empty(4, 3) for _ in range(2)]
    res = fastpar.broadcast(view, out=outs)
    assert res[0] is outs[0] and all(torch.equal(o, view) for o in outs)


def test_broadcast_coalesced_round_trips_mixed_dtypes():
    ts = [torch.arange(5.0), torch.arange(3), torch.ones(2, 2, dtype=torch.float16), torch.zeros(0)]
    res = fastpar.broadcast_coalesced(ts, ["cpu", "cpu"], buffer_size=12)
    assert len(res) == 2
    for per_dev in res:
        assert len(per_dev) == len(ts)
        for a, b in zip(per_dev, ts):
            assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_then_gather_round_trip(dtype, dim):
    x = torch.arange(6 * 7 * 5).reshape(6, 7, 5).to(dtype)
    parts = fastpar.scatter(x, ["cpu"] * 4, dim=dim)
    assert all(torch.equal(p, c) for p, c in zip(parts, x.chunk(4, dim)))
    assert all(p.is_contiguous() for p in parts)
    assert torch.equal(fastpar.gather(parts, dim=dim), x)


def test_scatter_uneven_chunks_and_zero_chunks():
    x = torch.arange(10 * 3).reshape(10, 3)
    parts = fastpar.scatter(x, ["cpu", "cpu", "cpu"], chunk_sizes=[7, 0, 3])
    assert [p.shape[0] for p in parts] == [7, 0, 3]
    assert torch.equal(parts[0], x[:7]) and torch.equal(parts[2], x[7:])
    assert torch.equal(fastpar.gather(parts), x)


def test_scatter_short_dimension_gives_fewer_chunks_like_torch():
    x = torch.arange(3.0)
    parts = fastpar.scatter(x, ["cpu"] * 5)
    assert len(parts) == len(x.chunk(5)) == 3


def test_scatter_into_out():
    x = torch.arange(12.0).reshape(4, 3)
    outs = [torch.empty(1, 3), torch.empty(3, 3)]
    fastpar.scatter(x, out=outs)
    assert torch.equal(outs[0], x[:1]) and torch.equal(outs[1], x[1:])


def test_gather_large_and_issue_argument_order():
    ts = [torch.randn(2**20 + 3), torch.randn(5)]
    assert torch.equal(fastpar.gather(ts, "cpu"), torch.cat(ts))
    assert torch.equal(fastpar.gather(ts, 0, -1), torch.cat(ts))
    out = torch.empty(2**20 + 8)
    assert fastpar.gather(ts, out=out) is out and torch.equal(out, torch.cat(ts))


@pytest.mark.parametrize("dtype", DTYPES)
def test_allgather_matches_cat(dtype):
    for n in (1, 2, 3, 8):
        for numel in (0, 1, 17, 1000):
            ts = [torch.arange(numel).to(dtype) + i for i in range(n)] if dtype != torch.uint8 else \
                [torch.arange(numel).to(dtype) for _ in range(n)]
            outs = fastpar.allgather(ts)
            expected = torch.cat(ts)
            assert len(outs) == n and all(torch.equal(o, expected) for o in outs)


def test_allgather_multidim_default_shape():
    ts = [torch.full((2, 3), float(i)) for i in range(3)]
    outs = fastpar.allgather(ts)
    assert outs[0].shape == (6, 3) and torch.equal(outs[2], torch.cat(ts))
