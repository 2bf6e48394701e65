"""The hierarchical paths: fake hosts (FASTPAR_HOST_ID) with shared memory
inside and gloo between the leaders, every collective with a hierarchical
schedule against a reference; fastpar._C.HierarchicalEngine (the composition
CUDA tensors get on several hosts) run on CPU stand-ins, and its refusal of a
composition that does not match its host layout, naming the argument and
both values, before any call."""
import datetime

import pytest
import torch.distributed as dist

import fastpar
from dist_harness import assert_ok, run

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


@pytest.mark.usefixtures("no_leftover_segments")
def test_hierarchical_two_hosts_of_two():
    """2 fake hosts x 2 ranks (world group), then, in new groups of the same 4
    processes, hosts interleaved in rank (A,B,A,B), uneven (A,A,B), uneven and
    interleaved (A,B,A over ranks 1-3) and 3+1 (A,A,A,B): every collective that
    has a hierarchical schedule, against a reference, with a 4 KiB slot so the
    larger sizes cross many chunks; one launch keeps start-up cost down."""
    host = lambda r: {"FASTPAR_HOST_ID": "nodeA" if r < 2 else "nodeB"}  # noqa: E731
    layouts = ["0,1,2,3:ABAB", "0,1,2:AAB", "1,2,3:ABA", "0,1,2,3:AAAB"]
    results = run("hierarchical", 4, per_rank_env=host, env={"FASTPAR_SHM_SLOT_BYTES": "4096"}, args=layouts,
                  timeout=240)
    assert_ok(results)
    out = "".join(r.out for r in results)
    for layout in ["nodeA", "nodeB", "hostA", "hostB"]:
        assert f"hierarchical collectives ok: {layout}" in out, out
    assert out.count("hierarchical collectives ok") == 4 + 4 + 3 + 3 + 4, out


@pytest.mark.usefixtures("no_leftover_segments")
def test_composed_hierarchical_backend():
    """fastpar._C.HierarchicalEngine, the composition CUDA tensors get on
    several hosts (CUDA IPC inside, NCCL between), run on CPU stand-ins: a
    fastpar group per fake host, gloo among the leaders and over the world.
    Hosts contiguous (AABB), interleaved (ABAB) and uneven (AAAB): every
    collective with a hierarchical schedule against a reference, and the
    forwarded ones."""
    results = run("composed_hierarchical", 4, env={"FASTPAR_SHM_SLOT_BYTES": "4096"}, args=["AABB", "ABAB", "AAAB"],
                  timeout=240)
    assert_ok(results)
    out = "".join(r.out for r in results)
    for layout in ["AABB", "ABAB", "AAAB"]:
        assert out.count(f"hierarchical collectives ok: {layout}") == 4, out
