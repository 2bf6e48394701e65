"""Scenarios for point-to-point and the direct calls, one process per rank:

    python p2p_worker.py SCENARIO RANK WORLD PORT [ARGS...]

Shares dist_worker.py's helpers (init, data, reference, check). Each scenario
asserts on its own results; the pytest side checks exit codes and messages."""
from __future__ import annotations

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import fastpar.distributed as fd
from dist_worker import ARGS, DTYPES, FLOATS, RANK, SCENARIO, WORLD, check, data, finish, init, ops_for, reference

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
    v = data(src * 7 + dst * 3 + tag, n, torch.int64 if dtype in (torch.bool, torch.complex64) else dtype)
    return v.to(dtype) if dtype != torch.bool else (v % 2 == 0)


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


def sc_direct():
    """fastpar.distributed.all_reduce / broadcast / all_gather_into_tensor:
    values as dist's, errors as dist's, misuse refused."""
    init()
    for dtype in DTYPES:
        for op in ops_for(dtype):
            for n in (0, 1, 7, 5003):
                xs = [data(q, n, dtype) for q in range(WORLD)]
                t = xs[RANK].clone()
                fd.all_reduce(t, op=op)
                check(t, reference(xs, op, dtype), f"direct all_reduce {dtype} {op} n={n}",
                      exact=op != dist.ReduceOp.AVG)
        for n in (0, 7, 5003):
            xs = [data(q, n, dtype) for q in range(WORLD)]
            for src in range(WORLD):
                t = xs[RANK].clone()
                fd.broadcast(t, src=src)
                check(t, xs[src], f"direct broadcast src={src} {dtype} n={n}")
            out = torch.empty(WORLD * n, dtype=dtype)
            fd.all_gather_into_tensor(out, xs[RANK])
            check(out, torch.cat(xs), f"direct all_gather_into_tensor {dtype} n={n}")

    # the same words as dist.all_reduce's
    expect(lambda: fd.all_reduce(torch.ones(4, 4).t()), ValueError, "fastpar.all_reduce: tensors[0] must be contiguous")
    expect(lambda: fd.all_reduce(torch.ones(3, dtype=torch.bool)), TypeError, "torch.bool",
           "which fastpar does not support")
    expect(lambda: fd.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND), ValueError, "op", "is not supported")
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


if __name__ == "__main__":
    globals()["sc_" + SCENARIO]()
