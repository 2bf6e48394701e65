"""Stock DDP on fastpar, the hierarchical path (2 fake hosts x 2 ranks), the
composed hierarchical backend of CUDA tensors on CPU stand-ins, and torchrun with env:// -- the issue's 'done when'."""
import os
import subprocess
import sys

import pytest

from dist_harness import ROOT, WORKER, assert_ok, child_env, free_port, run, shm_entries


def test_ddp_matches_single_process():
    before = shm_entries()
    assert_ok(run("ddp", 2))
    assert shm_entries() - before == set()


def test_hierarchical_two_hosts_of_two():
    """2 fake hosts x 2 ranks (world group), then, in new groups of the same 4
    processes, hosts interleaved in rank (A,B,A,B), uneven (A,A,B), uneven and
    interleaved (A,B,A over ranks 1-3) and 3+1 (A,A,A,B): every collective that
    has a hierarchical schedule, against a reference, with a 4 KiB slot so the
    larger sizes cross many chunks; one launch keeps start-up cost down."""
    before = shm_entries()
    host = lambda r: {"FASTPAR_HOST_ID": "nodeA" if r < 2 else "nodeB"}  # noqa: E731
    layouts = ["0,1,2,3:ABAB", "0,1,2:AAB", "1,2,3:ABA", "0,1,2,3:AAAB"]
    results = run("hierarchical", 4, per_rank_env=host, env={"FASTPAR_SHM_SLOT_BYTES": "4096"}, args=layouts,
                  timeout=240)
    assert_ok(results)
    out = "".join(r.out for r in results)
    for layout in ["nodeA", "nodeB", "hostA", "hostB"]:
        assert f"hierarchical collectives ok: {layout}" in out, out
    assert out.count("hierarchical collectives ok") == 4 + 4 + 3 + 3 + 4, out
    assert shm_entries() - before == set()


def test_composed_hierarchical_backend():
    """fastpar._C.HierarchicalEngine, the composition CUDA tensors get on
    several hosts (CUDA IPC inside, NCCL between), run on CPU stand-ins: a
    fastpar group per fake host, gloo among the leaders and over the world.
    Hosts contiguous (AABB), interleaved (ABAB) and uneven (AAAB): every
    collective with a hierarchical schedule against a reference, and the
    forwarded ones."""
    before = shm_entries()
    results = run("composed_hierarchical", 4, env={"FASTPAR_SHM_SLOT_BYTES": "4096"}, args=["AABB", "ABAB", "AAAB"],
                  timeout=240)
    assert_ok(results)
    out = "".join(r.out for r in results)
    for layout in ["AABB", "ABAB", "AAAB"]:
        assert out.count(f"hierarchical collectives ok: {layout}") == 4, out
    assert shm_entries() - before == set()


@pytest.mark.parametrize("spec", ["fastpar", "cpu:fastpar,cuda:fastpar"])
def test_torchrun_env_init(spec):
    before = shm_entries()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), WORKER, "torchrun", "0", "0", "0", spec]
    p = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "torchrun rank 0 ok" in p.stdout and "torchrun rank 1 ok" in p.stdout
    assert shm_entries() - before == set()
