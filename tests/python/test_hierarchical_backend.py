"""fastpar._C.HierarchicalEngine refuses a composition that does not match
its host layout, naming the argument and both values, before any call.
Its schedules: test_distributed_training.py::test_composed_hierarchical_backend."""
import datetime

import pytest
import torch.distributed as dist

import fastpar

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


def gloo_of_one():
    """A real one-rank backend (gloo over a local HashStore): no peers to wait for."""
    return dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=5))


def build(rank, size, host_of, local, leaders, world):
    return fastpar._C.HierarchicalEngine(rank, size, host_of, local, leaders, world)


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


def test_a_valid_composition_of_one_host_reports_its_parts():
    local, leaders, world = gloo_of_one(), gloo_of_one(), gloo_of_one()
    hb = build(0, 1, [0], local, leaders, world)
    assert hb.rank() == 0 and hb.size() == 1
    assert hb.hierarchical_calls == 0
    assert hb.local is not None and hb.leaders is not None and hb.world is not None
