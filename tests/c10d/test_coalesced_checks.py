"""The coalesced flat forms (all_gather_into_tensor / reduce_scatter_tensor
inside a coalescing block: torch calls allgather_into_tensor_coalesced /
reduce_scatter_tensor_coalesced on the backend) refuse bad pairs before any
engine runs, naming the op, the list, the index and both values. One process,
a group of one rank: the front's checks do not depend on the world size."""
import warnings

import pytest
import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _coalescing_manager

import fastpar  # noqa: F401  registers the backend


@pytest.fixture
def world_of_one():
    dist.init_process_group("fastpar", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def coalesced(fn, pairs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch 2.14 renamed both to *_single
        with _coalescing_manager():
            for out, inp in pairs:
                fn(out, inp)


F32, F64 = torch.float32, torch.float64


@pytest.mark.parametrize("fn,pairs,error,words", [
    (dist.all_gather_into_tensor, [(torch.zeros(3), torch.ones(3)), (torch.zeros(3), torch.ones(2))], ValueError,
     r"fastpar.all_gather_into_tensor_coalesced: outputs\[1\] has 3 elements but 2 were expected "
     r"\(world size x inputs\[1\]'s elements\)"),
    (dist.all_gather_into_tensor, [(torch.zeros(3), torch.ones(3)), (torch.zeros(2, dtype=F64), torch.ones(2, dtype=F64))],
     TypeError, r"fastpar.all_gather_into_tensor_coalesced: inputs\[1\] has dtype torch.float64 but inputs\[0\] has "
     r"dtype torch.float32"),
    (dist.reduce_scatter_tensor, [(torch.zeros(3), torch.ones(3)), (torch.zeros(2), torch.ones(4))], ValueError,
     r"fastpar.reduce_scatter_tensor_coalesced: inputs\[1\] has 4 elements but 2 were expected "
     r"\(world size x outputs\[1\]'s elements\)"),
    (dist.reduce_scatter_tensor, [(torch.zeros(3), torch.ones(3)), (torch.zeros(2, dtype=F64), torch.ones(2, dtype=F64))],
     TypeError, r"fastpar.reduce_scatter_tensor_coalesced: outputs\[1\] has dtype torch.float64 but outputs\[0\] has "
     r"dtype torch.float32"),
])
def test_bad_pairs_are_named(world_of_one, fn, pairs, error, words):
    with pytest.raises(error, match=words):
        coalesced(fn, pairs)


def test_good_pairs_run(world_of_one):
    outs = [torch.zeros(3), torch.zeros(2)]
    coalesced(dist.all_gather_into_tensor, [(outs[0], torch.full((3,), 2.0)), (outs[1], torch.full((2,), 3.0))])
    assert torch.equal(outs[0], torch.full((3,), 2.0)) and torch.equal(outs[1], torch.full((2,), 3.0))
    coalesced(dist.reduce_scatter_tensor, [(outs[0], torch.full((3,), 5.0)), (outs[1], torch.full((2,), 7.0))])
    assert torch.equal(outs[0], torch.full((3,), 5.0)) and torch.equal(outs[1], torch.full((2,), 7.0))
