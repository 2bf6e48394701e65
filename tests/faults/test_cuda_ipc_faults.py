"""Faults over CUDA IPC, multi-process ("cpu:fastpar,cuda:fastpar"): a
SIGKILLed peer makes every survivor raise within seconds, desynced calls
fail on every rank naming both, abort() stops a waiting kernel, a receive
that does not match the next message fails, registered_empty on one rank
alone fails at once. The CPU path's faults: test_faults.py.

Skips without a GPU (and in CPU-only builds of fastpar)."""
from __future__ import annotations

import datetime
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

import fastpar.distributed as fd
from batched_scenarios import (CUDA_LAYOUTS, CUDA_MARKS, NGPU, REGISTERED, InBatch, assert_scenario_ok, batched,
                               run_cuda, scenario_result)
from dist_harness import assert_ok, scenario
from worker_context import ARGS, DEV, RANK, WORLD, cuda_backend, group_timeout_s, init

pytestmark = CUDA_MARKS


@scenario
def sc_registered_alone():
    """registered_empty is collective (every rank calls it, as on the CPU
    path): rank 0 allocating while the others call all_reduce fails on every
    rank within seconds (the descriptors differ at once; the group's timeout
    is not waited out), rank 0's error naming registered_empty and its bytes
    against the peer's all_reduce."""
    init(timeout_s=30)
    dist.all_reduce(torch.ones(16, device=DEV))  # sets IPC up on every rank first
    torch.cuda.synchronize()
    t0 = time.monotonic()
    try:
        if RANK == 0:
            fd.registered_empty((300_000,), torch.float32, device=DEV)
        else:
            dist.all_reduce(torch.ones(300_000, device=DEV))
            torch.cuda.synchronize()
            dist.all_reduce(torch.ones(1, device=DEV))
        raise AssertionError("registered_empty on one rank alone did not raise")
    except dist.DistBackendError as e:
        msg, elapsed = str(e), time.monotonic() - t0
        print(f"raised after {elapsed:.1f}s: {msg}", flush=True)
        assert "collective mismatch" in msg or "aborted" in msg, msg
        if RANK == 0:
            assert "registered_empty over CUDA IPC failed on rank 0" in msg, msg
        if "collective mismatch" in msg:
            assert "registered_empty(bytes=1200000, offset=" in msg and "allreduce(count=300000" in msg, msg
        assert elapsed < 15, f"took {elapsed:.1f}s: a mismatch shows at once, not at the 30 s timeout"
    dist.destroy_process_group()
    print(f"registered_alone rank {RANK} ok", flush=True)


@pytest.mark.parametrize("layout,world", CUDA_LAYOUTS)
@batched(InBatch(sc_registered_alone, env=REGISTERED, order=1))
def test_registered_empty_is_collective_a_rank_alone_fails_at_once(request, layout, world):
    assert_scenario_ok(scenario_result(request), "cuda", "registered_alone")


@scenario
def sc_p2p_mismatch():
    """Rank 0 sends with tag 1 (or 100 elements), rank 1 receives with tag 2
    (or 50 elements, ARGS[0] = "size"): rank 1's receive fails with
    DistBackendError naming recv (FASTPAR_BLOCKING_WAIT=1 raises it at wait())
    and never writes its buffer; rank 0's send completes (it fits the ring)."""
    store = init()
    dist.all_reduce(torch.ones(1, device=DEV))
    by_size = ARGS and ARGS[0] == "size"
    if RANK == 0:
        dist.send(torch.ones(100, device=DEV), dst=1, tag=1)
        torch.cuda.synchronize()
        # Rank 1's receive reads our ring: our arena must outlive its checks.
        store.wait(["mismatch checked"], datetime.timedelta(seconds=2 * group_timeout_s()))
    elif RANK == 1:
        t = torch.full((50 if by_size else 100,), 3.0, device=DEV)
        try:
            dist.recv(t, src=0, tag=1 if by_size else 2)
            raise AssertionError("mismatched recv did not raise")
        except dist.DistBackendError as e:
            assert "recv over CUDA IPC failed on rank 1" in str(e), str(e)
            assert "tag or size" in str(e), str(e)
        assert bool((t.cpu() == 3.0).all()), "mismatched receive wrote its buffer"
        store.set("mismatch checked", "1")
    time.sleep(1)
    os._exit(0)


@pytest.mark.parametrize("variant", ["tag", "size"])
def test_a_receive_that_does_not_match_the_next_message_fails(variant):
    results = run_cuda(sc_p2p_mismatch, 2, "shared", env={"FASTPAR_BLOCKING_WAIT": "1"}, args=(variant,))
    assert_ok(results)


@scenario
def sc_ipc_sigkill():
    """The last rank is SIGKILLed between collectives; every survivor's next
    IPC collective must raise DistBackendError naming the op and the dead rank
    within seconds, long before the (60 s) group timeout: the peer watcher
    sees the death in /proc and raises the host abort word the phase kernels
    poll. ARGS[0]: "blocking" (FASTPAR_BLOCKING_WAIT=1: wait() raises) or
    "async" (the default wait(): it synchronizes once a peer is dead);
    ARGS[1]: the op ("all_reduce", "broadcast", or "direct":
    fastpar.distributed.all_reduce, which has no Work to wait on)."""
    mode, op = ARGS[0], ARGS[1]
    init(timeout_s=60)
    t = torch.ones(1024, device=DEV)
    dist.all_reduce(t)
    assert torch.all(t == WORLD)
    assert cuda_backend().ipc_state.startswith("ipc"), cuda_backend().ipc_state
    torch.cuda.synchronize()
    dist.barrier()  # CPU: every rank is past the first all_reduce
    dead = WORLD - 1
    if RANK == dead:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    t0 = time.monotonic()

    def step(what):  # where the time goes, should a run ever hang again (a destroy once hung here)
        print(f"[{time.monotonic() - t0:6.2f}s] {what}", flush=True)
    try:
        if op == "direct":
            fd.all_reduce(t)
            step("direct all_reduce returned")
        else:
            work = (dist.all_reduce(t, async_op=True) if op == "all_reduce" else
                    dist.broadcast(t, src=0, async_op=True))
            step(f"{op} enqueued")
            work.wait()
            step("wait() returned")
        torch.cuda.synchronize()
        step("synchronize() returned")
        dist.all_reduce(t)  # refused at the start if wait() did not raise
        raise AssertionError("no error after the peer was killed")
    except dist.DistBackendError as e:
        msg = str(e)
        elapsed = time.monotonic() - t0
        print(f"raised after {elapsed:.1f}s: {msg}", flush=True)
        assert f"rank {RANK}" in msg and f"rank {dead} (pid" in msg and "exited" in msg, msg
        assert op in msg or "all_reduce" in msg, msg
        assert elapsed < 10, f"took {elapsed:.1f}s: the watcher should stop the kernels within seconds"
    assert cuda_backend().dead_peer == dead, cuda_backend().dead_peer
    # abort must not wait for anything: the arena is abandoned, no process stays stuck.
    t1 = time.monotonic()
    dist.destroy_process_group()
    print(f"destroy after the death took {time.monotonic() - t1:.1f}s", flush=True)
    total = time.monotonic() - t0
    assert total < 10, f"the scenario took {total:.1f}s after the death (the bound: 10 s)"
    os._exit(0)


@pytest.mark.parametrize("layout,world", [("shared", 2), ("shared", 3)] +
                         ([("distinct", 2)] if NGPU >= 2 else []))
@pytest.mark.parametrize("mode", ["blocking", "async"])
@pytest.mark.parametrize("op", ["all_reduce", "broadcast", "direct"])
def test_sigkilled_peer_makes_every_survivor_raise_within_seconds(layout, world, mode, op):
    if layout == "distinct" and not (torch.cuda.can_device_access_peer(0, 1) and
                                     torch.cuda.can_device_access_peer(1, 0)):
        pytest.skip("GPUs 0 and 1 have no peer access: the calls go to NCCL, whose faults are NCCL's")
    env = {"FASTPAR_BLOCKING_WAIT": "1"} if mode == "blocking" else {}
    results = run_cuda(sc_ipc_sigkill, world, layout, env=env, args=[mode, op], timeout=120)
    for survivor in results[:-1]:
        assert survivor.rc == 0, survivor.out + survivor.err
        assert "raised after" in survivor.out, survivor.out
    assert results[-1].rc == -9, results[-1].err  # SIGKILL


@scenario
def sc_desync():
    """Ranks call different collectives (ARGS[0]: "numel" - all_reduce of
    different sizes; "root" - broadcast from different roots; "op" - all_reduce
    vs all_gather_into_tensor of equal bytes): every rank raises
    DistBackendError naming both calls (or, where a peer gave up first, that
    it aborted), and the group
    is unusable afterwards (the next call raises at once)."""
    init(timeout_s=30)
    t = torch.ones(16, device=DEV)
    dist.all_reduce(t)
    variant = ARGS[0]
    try:
        if variant == "numel":
            w = dist.all_reduce(torch.ones(100 + (RANK == 0) * 4, device=DEV), async_op=True)
        elif variant == "root":
            w = dist.broadcast(torch.ones(100, device=DEV), src=min(RANK, 1), async_op=True)
        else:
            if RANK == 0:
                w = dist.all_reduce(torch.ones(100 * WORLD, device=DEV), async_op=True)
            else:
                w = dist.all_gather_into_tensor(torch.empty(100 * WORLD, device=DEV), torch.ones(100, device=DEV),
                                                async_op=True)
        w.wait()
        torch.cuda.synchronize()
        dist.all_reduce(t)
        raise AssertionError("a desynced call did not raise")
    except dist.DistBackendError as e:
        msg = str(e)
        print(f"raised: {msg}", flush=True)
        assert "collective mismatch" in msg or "aborted" in msg, msg
        if "collective mismatch" in msg:
            # Both calls named, in the CPU path's words (this rank's first).
            mine = {"numel": f"allreduce(count={100 + (RANK == 0) * 4}, dtype=float32",
                    "root": f"broadcast(count=100, dtype=float32, root={min(RANK, 1)}, schedule=",
                    "op": f"allreduce(count={100 * WORLD}" if RANK == 0 else "allgather(count=100"}[variant]
            assert f"rank {RANK} called {mine}" in msg and " but rank " in msg, msg
    try:
        dist.broadcast(t, src=0)
        raise AssertionError("the group was usable after a failure")
    except dist.DistBackendError as e:
        assert "fastpar: broadcast over CUDA IPC failed" in str(e), str(e)
    dist.destroy_process_group()
    print(f"desync rank {RANK} ok", flush=True)


@pytest.mark.parametrize("variant", ["numel", "root", "op"])
@batched(lambda p: InBatch(sc_desync, [p["variant"]], order=1))
def test_desynced_calls_fail_on_every_rank(request, variant):
    assert_ok(scenario_result(request))


@scenario
def sc_abort():
    """Rank 0 waits in an all_reduce that rank 1 never joins; a thread of
    rank 0 aborts the group after 1 s: the kernel stops (host abort word) and
    the process exits promptly instead of waiting out the 60 s timeout."""
    import threading
    init(timeout_s=60)
    t = torch.ones(16, device=DEV)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    dist.barrier()
    if RANK == 0:
        threading.Timer(1.0, cuda_backend().abort).start()
        t0 = time.monotonic()
        dist.all_reduce(t)
        torch.cuda.synchronize()  # returns once the aborted kernel gives up
        elapsed = time.monotonic() - t0
        print(f"aborted kernel returned after {elapsed:.1f}s", flush=True)
        assert elapsed < 20, elapsed
        try:
            dist.all_reduce(t)
            raise AssertionError("no error after abort()")
        except dist.DistBackendError as e:
            assert "aborted" in str(e), str(e)
    else:
        time.sleep(3)
    os._exit(0)


def test_abort_stops_a_waiting_kernel():
    results = run_cuda(sc_abort, 2, "shared", timeout=120)
    assert all(r.rc == 0 for r in results), [(r.rc, r.out, r.err) for r in results]
    assert "aborted kernel returned after" in results[0].out, results[0].out
