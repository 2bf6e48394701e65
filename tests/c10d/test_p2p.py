"""Point-to-point over shared memory (send / recv / isend / irecv /
batch_isend_irecv / any source / tags / objects) and the direct calls
(fastpar.distributed.all_reduce, broadcast, all_gather_into_tensor), in real
processes. 1 KiB channel chunks make every size above 1 KiB cross several
chunks and wrap the 4-chunk ring. On CUDA tensors: send/recv over CUDA IPC
(batched with the other CUDA scenarios, batched_scenarios.py; skipped
without a GPU)."""
from __future__ import annotations

import os
import re
import signal
import sys
import time

import pytest
import torch
import torch.distributed as dist

import fastpar.distributed as fd
from batched_scenarios import CUDA_LAYOUTS, assert_scenario_ok, batched, cuda_only, scenario_result, shapes
from dist_harness import assert_ok, run, scenario
from reference import DTYPES, exact_data, reference
from worker_context import (ARGS, DEV, RANK, SHARED, WORLD, check, check_equal, cuda_backend, finish, init, ops_for,
                            peer_access_everywhere)

pytestmark = pytest.mark.usefixtures("no_leftover_segments")
SMALL_CHUNKS = {"FASTPAR_SHM_P2P_CHUNK_BYTES": "1024"}


# Every dtype moves over point to point, reducible or not.
P2P_DTYPES = DTYPES + [torch.bool, torch.int16, torch.complex64]
SIZES = [0, 1, 7, 1000, 5003]  # with 1 KiB chunks: one chunk, many, a partial last one


def expect(fn, exc, *fragments):
    """fn() raises exc whose message holds every fragment; printed for the test."""
    try:
        fn()
    except exc as e:
        for f in fragments:
            assert f in str(e), f"expected {f!r} in: {e}"
        print("ERROR:", e, flush=True)
        return
    raise AssertionError(f"no error; expected {fragments}")


def payload(src: int, dst: int, n: int, dtype: torch.dtype, tag: int = 0) -> torch.Tensor:
    v = exact_data(src * 7 + dst * 3 + tag, n, torch.int64 if dtype in (torch.bool, torch.complex64) else dtype)
    return v.to(dtype) if dtype != torch.bool else (v % 2 == 0)


@scenario
def sc_p2p_values():
    """send/recv, isend/irecv, batch_isend_irecv, any source, tags out of order,
    objects: every dtype and size against the values the sender made."""
    init()
    right, left = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    for dtype in P2P_DTYPES:
        for n in SIZES:
            what = f"{dtype} n={n}"
            # ring exchange with isend / irecv: every rank sends and receives at once
            got = torch.empty(n, dtype=dtype)
            reqs = [dist.isend(payload(RANK, right, n, dtype), right), dist.irecv(got, left)]
            for r in reqs:
                r.wait()
            check(got, payload(left, RANK, n, dtype), f"isend/irecv ring {what}")
            # batch_isend_irecv, both directions of every pair
            ops, outs = [], {}
            for q in range(WORLD):
                if q == RANK:
                    continue
                outs[q] = torch.empty(n, dtype=dtype)
                ops.append(dist.P2POp(dist.isend, payload(RANK, q, n, dtype, tag=1), q, tag=1))
                ops.append(dist.P2POp(dist.irecv, outs[q], q, tag=1))
            for r in dist.batch_isend_irecv(ops):
                r.wait()
            for q, t in outs.items():
                check(t, payload(q, RANK, n, dtype, tag=1), f"batch_isend_irecv from {q} {what}")
    # blocking send / recv, and recv from any source returning the sender
    n = 3000
    if RANK == 0:
        for _ in range(WORLD - 1):
            t = torch.empty(n, dtype=torch.int32)
            sender = dist.recv(t)
            check(t, payload(sender, 0, n, torch.int32), f"recv from any source (sender {sender})")
    else:
        dist.send(payload(RANK, 0, n, torch.int32), 0)
    # tags out of order: the receive for tag 2 comes first, so the larger tag-1
    # message ahead of it is drained to a heap buffer and matched afterwards
    if RANK == 0:
        dist.send(payload(0, 1, 5000, torch.float32, tag=1), 1, tag=1)
        dist.send(payload(0, 1, 10, torch.float32, tag=2), 1, tag=2)
    elif RANK == 1:
        b = torch.empty(10)
        dist.recv(b, 0, tag=2)
        a = torch.empty(5000)
        dist.recv(a, 0, tag=1)
        check(b, payload(0, 1, 10, torch.float32, tag=2), "tag 2 received first")
        check(a, payload(0, 1, 5000, torch.float32, tag=1), "tag 1 drained then matched")
    # an isend larger than the ring whose owner goes on to a collective before
    # waiting: the progress thread must finish it while the peer receives
    big = 40000
    if RANK == 0:
        w = dist.isend(payload(0, 1, big, torch.float64), 1)
        dist.barrier()
        w.wait()
        assert w.is_completed()
    elif RANK == 1:
        t = torch.empty(big, dtype=torch.float64)
        dist.recv(t, 0)
        dist.barrier()
        check(t, payload(0, 1, big, torch.float64), "isend progressed in the background")
    else:
        dist.barrier()
    # object helpers built on send / recv
    if RANK == 0:
        dist.send_object_list([{"step": 7, "name": "fastpar"}, [1, 2, 3]], dst=1)
    elif RANK == 1:
        objs = [None, None]
        dist.recv_object_list(objs, src=0)
        assert objs == [{"step": 7, "name": "fastpar"}, [1, 2, 3]], objs
    # collectives still work after all of it
    t = torch.ones(10)
    dist.all_reduce(t)
    assert torch.all(t == WORLD)
    print("p2p_values: ok", flush=True)
    finish()


@scenario
def sc_p2p():
    """send/recv over CUDA IPC (after one collective has set IPC up): every
    ordered pair at once through batch_isend_irecv, every dtype, sizes from 0
    to more chunks than a ring holds, messages matched in order per pair with
    their tags; isend/irecv with wait(); the receiver's stream waits for the
    data; a receive from any source is refused by name on a shared GPU."""
    init()
    cb = cuda_backend()
    dist.all_reduce(torch.ones(1, device=DEV))  # sets the group's IPC communicator up
    ipc = peer_access_everywhere()
    calls0, fb0 = cb.ipc_calls, cb.fallback_calls
    seed = 900
    for dtype in DTYPES:
        for n in (0, 1, 17, 1000, 100_003, (1 << 20) + 5):
            seed += 1
            ops, got = [], {}
            for q in range(WORLD):
                if q == RANK:
                    continue
                ops.append(dist.P2POp(dist.isend, exact_data(RANK * 7 + q, n, dtype, seed).to(DEV), q, tag=q))
                got[q] = torch.full((n,), 3, dtype=dtype, device=DEV)
                ops.append(dist.P2POp(dist.irecv, got[q], q, tag=RANK))
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            for q, t in got.items():
                check_equal(t, exact_data(q * 7 + RANK, n, dtype, seed), f"batch_isend_irecv {dtype} n={n} from {q}",
                            True)
    # Several messages to one peer, in order, different tags and sizes.
    if RANK in (0, 1):
        peer = 1 - RANK
        sizes = [5, 0, 300_000, 7]
        if RANK == 0:
            works = [dist.isend(torch.arange(k, dtype=torch.float32, device=DEV) + i, dst=peer, tag=i)
                     for i, k in enumerate(sizes)]
        else:
            bufs = [torch.empty(k, device=DEV) for k in sizes]
            works = [dist.irecv(b, src=peer, tag=i) for i, b in enumerate(bufs)]
        for w in works:
            w.wait()
        if RANK == 1:
            # wait() ordered this stream after the receives: no synchronize needed.
            for i, (k, b) in enumerate(zip(sizes, bufs)):
                check_equal(b, torch.arange(k, dtype=torch.float32) + i, f"isend/irecv message {i}", True)
        # Blocking send/recv.
        if RANK == 0:
            dist.send(torch.full((33,), 2.5, device=DEV), dst=1, tag=7)
        else:
            t = torch.empty(33, device=DEV)
            dist.recv(t, src=0, tag=7)
            check_equal(t, torch.full((33,), 2.5), "send/recv", True)
    if ipc:
        assert cb.fallback_calls == fb0, (cb.fallback_calls, fb0)
        assert cb.ipc_calls > calls0
    if SHARED:
        try:
            dist.recv(torch.empty(1, device=DEV))
            raise AssertionError("recv from any source on a shared GPU did not raise")
        except ValueError as e:
            assert "fastpar.recv: a receive from any source" in str(e), str(e)
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()
    print(f"p2p rank {RANK} ok", flush=True)


@pytest.mark.parametrize("device,layout,world", shapes(cpu_worlds=[2, 3]))
@batched(lambda p: sc_p2p if p["device"] == "cuda" else None)
def test_p2p_against_sent_values(request, device, layout, world):
    if device == "cuda":  # every ordered pair, every dtype, sizes past a ring's chunks, tags, any source refused
        assert_scenario_ok(scenario_result(request), device, "p2p")
        return
    results = run(sc_p2p_values, world, env=SMALL_CHUNKS, timeout=170)
    assert_ok(results)
    assert all("p2p_values: ok" in r.out for r in results), [r.out for r in results]


@scenario
def sc_p2p_first():
    """init_process_group(device_id=...) sets CUDA IPC up when the group is
    created, so send/recv as the group's first CUDA calls run over IPC (on a
    shared GPU, where NCCL cannot run, they would otherwise be refused); then
    a new group inherits the bound device and is set up at creation too."""
    init(device_id=DEV)
    cb = cuda_backend()
    ipc = peer_access_everywhere()
    assert cb.ipc_state != "not set up", cb.ipc_state
    if ipc:
        assert cb.ipc_state.startswith("ipc"), cb.ipc_state
    peer = RANK ^ 1
    if peer < WORLD:
        x = torch.arange(1000, dtype=torch.float32, device=DEV) + RANK
        got = torch.empty(1000, device=DEV)
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, got, peer)]):
            w.wait()
        check_equal(got, torch.arange(1000, dtype=torch.float32) + peer, "send/recv before any collective", True)
        if ipc:
            assert cb.fallback_calls == 0 and cb.ipc_calls >= 2, (cb.fallback_calls, cb.ipc_calls)
    g = dist.new_group(list(range(WORLD)))
    assert cuda_backend(g).ipc_state != "not set up", cuda_backend(g).ipc_state
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()
    print(f"p2p_first rank {RANK} ok", flush=True)


@pytest.mark.parametrize("layout,world", CUDA_LAYOUTS)
@cuda_only
@batched(sc_p2p_first)
def test_send_recv_first_with_a_bound_device(request, layout, world):
    assert_scenario_ok(scenario_result(request), "cuda", "p2p_first")


@scenario
def sc_p2p_hosts():
    """Ranks on different (faked) hosts: point to point goes over the world
    gloo group, any source included."""
    init()
    assert fd.get_fastpar_backend().hierarchical
    n = 5003
    if RANK == 0:
        for q in range(1, WORLD):
            got = torch.empty(n, dtype=torch.float16)
            sender = dist.recv(got)
            check(got, payload(sender, 0, n, torch.float16), f"recv from any host (sender {sender})")
        dist.send(payload(0, 1, n, torch.int64, tag=3), 1, tag=3)
    else:
        dist.isend(payload(RANK, 0, n, torch.float16), 0).wait()
        if RANK == 1:
            t = torch.empty(n, dtype=torch.int64)
            dist.recv(t, 0, tag=3)
            check(t, payload(0, 1, n, torch.int64, tag=3), "recv across hosts")
    print("p2p_hosts: ok", flush=True)
    finish()


def test_p2p_across_hosts_uses_gloo():
    results = run(sc_p2p_hosts, 3, per_rank_env=lambda r: {"FASTPAR_HOST_ID": f"host{r % 2}"})
    assert_ok(results)
    assert all("p2p_hosts: ok" in r.out for r in results)


@scenario
def sc_p2p_bad_input():
    """Refused before any work, with the argument and both values; last, a size
    mismatch fails the receiver with both sides' sizes."""
    init()
    bad = (ValueError, RuntimeError)
    pg = fd.get_fastpar_backend()
    expect(lambda: pg.send([torch.ones(3)], RANK, 0).wait(), bad, "fastpar.send: dst is", "must be another rank")
    expect(lambda: pg.send([torch.ones(3)], WORLD, 0).wait(), bad, f"fastpar.send: dst is {WORLD}")
    expect(lambda: pg.recv([torch.ones(3)], -2, 0).wait(), bad, "fastpar.recv: src is -2")
    expect(lambda: dist.send(torch.ones(4, 4).t(), (RANK + 1) % WORLD), bad,
           "fastpar.send: tensors[0] must be contiguous")
    dist.barrier()  # nothing was sent: the group is still usable
    if RANK == 0:
        dist.send(torch.ones(10), 1)
    elif RANK == 1:
        expect(lambda: dist.recv(torch.empty(20), 0), bad,
               "fastpar.recv on rank 1: rank 0 sent 40 bytes (float32 x 10) with tag 0 but this receive expects 80 "
               "bytes (float32 x 20)")
        expect(lambda: dist.recv(torch.empty(10), 0), bad, "rank 0 sent 40 bytes")  # the engine stays failed
    print("p2p_bad_input: ok", flush=True)
    sys.exit(0)  # rank 1 aborted the communicator: no destroy, no further collective


def test_p2p_bad_input_and_size_mismatch():
    results = run(sc_p2p_bad_input, 2, env=SMALL_CHUNKS)
    assert_ok(results)
    assert "rank 0 sent 40 bytes (float32 x 10) with tag 0 but this receive expects 80 bytes" in results[1].out


def _elapsed(err: str) -> float:
    m = re.search(r"ERROR after ([0-9.]+)s", err)
    assert m, err
    return float(m.group(1))


@scenario
def sc_p2p_fault():
    """ARGS[0]: 'kill_before_send' (the receiver waits on a sender that dies),
    'kill_mid_transfer' (the sender dies with a message half delivered) or
    'never_sends' (the receiver times out). ARGS[1]: the group timeout."""
    kind, timeout_s = ARGS[0], float(ARGS[1])
    init(timeout_s=timeout_s)
    dist.barrier()  # both past init: rank 0 also serves the TCPStore, which must outlive init
    n = 200000  # 800 KB: far larger than the 4 KiB ring the test sets
    if RANK == 0:
        if kind == "kill_mid_transfer":
            dist.isend(torch.ones(n), 1)  # returns once the ring is full; 800 chunks to go
        if kind != "never_sends":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(timeout_s + 5)
        sys.exit(0)
    t0 = time.monotonic()
    try:
        dist.recv(torch.empty(n), 0)
    except dist.DistBackendError as e:
        print(f"ERROR after {time.monotonic() - t0:.1f}s: {e}", file=sys.stderr)
        sys.exit(3)
    sys.exit(0)


@pytest.mark.parametrize("kind", ["kill_before_send", "kill_mid_transfer"])
def test_p2p_peer_dies(kind):
    # a 60 s timeout: the receiver must notice the death itself, within seconds
    results = run(sc_p2p_fault, 2, env={"FASTPAR_SHM_P2P_CHUNK_BYTES": "1024"}, args=[kind, 60],
                  timeout=50)
    assert results[0].rc == -9, results[0].err
    r1 = results[1]
    assert r1.rc == 3, (r1.rc, r1.err)
    assert "fastpar.recv on rank 1: rank 0 (pid" in r1.err and "exited while this rank waited" in r1.err, r1.err
    assert "timeout 60000 ms" in r1.err
    if kind == "kill_mid_transfer":
        assert re.search(r"[1-9][0-9]* of 800000 bytes moved", r1.err), r1.err
    assert _elapsed(r1.err) < 30


def test_p2p_timeout():
    results = run(sc_p2p_fault, 2, args=["never_sends", 2], timeout=60)
    r1 = results[1]
    assert r1.rc == 3, (r1.rc, r1.err)
    assert "fastpar.recv on rank 1 timed out after 2000 ms waiting for rank 0" in r1.err, r1.err
    assert "has not posted the matching send" in r1.err


@scenario
def sc_direct():
    """fastpar.distributed.all_reduce / broadcast / all_gather_into_tensor:
    values as dist's, errors as dist's, misuse refused."""
    init()
    for dtype in DTYPES:
        for op in ops_for(dtype):
            for n in (0, 1, 7, 5003):
                xs = [exact_data(q, n, dtype) for q in range(WORLD)]
                t = xs[RANK].clone()
                fd.all_reduce(t, op=op)
                check(t, reference(xs, op), f"direct all_reduce {dtype} {op} n={n}",
                      exact=op != dist.ReduceOp.AVG)
        for n in (0, 7, 5003):
            xs = [exact_data(q, n, dtype) for q in range(WORLD)]
            for src in range(WORLD):
                t = xs[RANK].clone()
                fd.broadcast(t, src=src)
                check(t, xs[src], f"direct broadcast src={src} {dtype} n={n}")
            out = torch.empty(WORLD * n, dtype=dtype)
            fd.all_gather_into_tensor(out, xs[RANK])
            check(out, torch.cat(xs), f"direct all_gather_into_tensor {dtype} n={n}")

    # the same words as dist.all_reduce's
    expect(lambda: fd.all_reduce(torch.ones(3, 4, dtype=torch.float32, device="meta")), ValueError,
           "fastpar.all_reduce: tensors[0] is on device 'meta'")
    expect(lambda: fd.all_reduce(torch.ones(3, dtype=torch.int16)), TypeError, "torch.int16",
           "which fastpar does not reduce")
    expect(lambda: fd.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND), TypeError, "op is ReduceOp.BAND",
           "integer and bool")
    expect(lambda: fd.all_reduce(torch.ones(3), op=dist._make_nccl_premul_sum(2.0)), ValueError, "op",
           "is not supported")
    expect(lambda: fd.broadcast(torch.ones(3), src=WORLD + 5), (ValueError, RuntimeError), str(WORLD + 5))
    expect(lambda: fd.all_gather_into_tensor(torch.empty(3), torch.ones(3)), ValueError,
           "fastpar.all_gather_into_tensor: output_tensor")
    # a subgroup of ranks 0 and 1 (a fastpar group of its own); the others are not members
    sub = dist.new_group([0, 1])
    t = torch.full((5,), float(RANK + 1))
    fd.all_reduce(t, group=sub)
    if RANK < 2:
        assert torch.all(t == 3), t
        t = torch.full((3,), float(RANK))
        fd.broadcast(t, src=1, group=sub)
        assert torch.all(t == 1), t
    else:
        assert torch.all(t == RANK + 1), "a non-member's tensor must be left alone"
    # a group on another backend is refused, naming it
    gloo = dist.new_group(list(range(WORLD)), backend="gloo")
    expect(lambda: fd.all_reduce(torch.ones(3), group=gloo), TypeError, "ProcessGroupGloo", "not fastpar")
    # still in step with dist.* afterwards
    t = torch.ones(4)
    fd.all_reduce(t)
    dist.all_reduce(t)
    assert torch.all(t == WORLD * WORLD), t
    print("direct: ok", flush=True)
    finish()


@pytest.mark.parametrize("world", [2, 3])
def test_direct_calls(world):
    results = run(sc_direct, world, timeout=170)
    assert_ok(results)
    assert "direct: ok" in results[0].out, results[0].out
