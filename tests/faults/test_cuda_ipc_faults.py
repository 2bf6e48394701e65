"""Faults over CUDA IPC, multi-process ("cpu:fastpar,cuda:fastpar"): a
SIGKILLed peer makes every survivor raise within seconds, desynced calls
fail on every rank naming both, abort() stops a waiting kernel, a receive
that does not match the next message fails, registered_empty on one rank
alone fails at once. The CPU path's faults: test_faults.py.

Skips without a GPU (and in CPU-only builds of fastpar)."""
import pytest
import torch

from batched_scenarios import (CUDA_LAYOUTS, CUDA_MARKS, NGPU, TWO_RANK_LAYOUT, assert_scenario_ok, batched, run_cuda,
                               scenario_result)
from dist_harness import assert_ok

pytestmark = CUDA_MARKS


@pytest.mark.parametrize("layout,world", CUDA_LAYOUTS)
@batched("registered_alone")
def test_registered_empty_is_collective_a_rank_alone_fails_at_once(request, layout, world):
    assert_scenario_ok(scenario_result(request, "cuda", layout, world, "registered_alone"), "cuda", "registered_alone")


@pytest.mark.parametrize("variant", ["tag", "size"])
def test_a_receive_that_does_not_match_the_next_message_fails(variant):
    results = run_cuda("p2p_mismatch", 2, "shared", env={"FASTPAR_BLOCKING_WAIT": "1"}, args=(variant,))
    assert_ok(results)


@pytest.mark.parametrize("layout,world", [("shared", 2), ("shared", 3)] +
                         ([("distinct", 2)] if NGPU >= 2 else []))
@pytest.mark.parametrize("mode", ["blocking", "async"])
@pytest.mark.parametrize("op", ["all_reduce", "broadcast"])
def test_sigkilled_peer_makes_every_survivor_raise_within_seconds(layout, world, mode, op):
    if layout == "distinct" and not (torch.cuda.can_device_access_peer(0, 1) and
                                     torch.cuda.can_device_access_peer(1, 0)):
        pytest.skip("GPUs 0 and 1 have no peer access: the calls go to NCCL, whose faults are NCCL's")
    env = {"FASTPAR_BLOCKING_WAIT": "1"} if mode == "blocking" else {}
    results = run_cuda("ipc_sigkill", world, layout, env=env, args=[mode, op], timeout=120)
    for survivor in results[:-1]:
        assert survivor.rc == 0, survivor.out + survivor.err
        assert "raised after" in survivor.out, survivor.out
    assert results[-1].rc == -9, results[-1].err  # SIGKILL


@pytest.mark.parametrize("variant", ["numel", "root", "op"])
@batched(lambda p: f"desync-{p['variant']}")
def test_desynced_calls_fail_on_every_rank(request, variant):
    assert_ok(scenario_result(request, "cuda", TWO_RANK_LAYOUT, 2, f"desync-{variant}"))


def test_abort_stops_a_waiting_kernel():
    results = run_cuda("abort", 2, "shared", timeout=120)
    assert all(r.rc == 0 for r in results), [(r.rc, r.out, r.err) for r in results]
    assert "aborted kernel returned after" in results[0].out, results[0].out
