"""Fault scenarios on the CPU (dist_worker.py runs them): a missing peer, a
peer that stops calling, a SIGKILLed peer, ranks that disagree, two jobs
side by side, group life cycles, hostile or broken peers and a small
/dev/shm. Each asserts on its own results or prints what the test checks.
The CUDA IPC faults: scenarios_cuda_faults.py."""
from __future__ import annotations

import ctypes
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import fastpar.distributed as fd
from worker_context import ARGS, PORT, RANK, TIMEOUT_S, WORLD, init


def sc_mismatch():
    """Ranks that call different collectives, sizes, dtypes or splits get an
    error that says so. Each case runs in a fresh fastpar group (a failed
    communicator stays failed), and the world group must survive them all."""
    init()
    for kind in ARGS:
        g = dist.new_group(backend="fastpar")
        try:
            if kind == "op":
                if RANK == 0:
                    dist.all_reduce(torch.ones(10), group=g)
                else:
                    dist.broadcast(torch.ones(10), src=0, group=g)
            elif kind == "size":
                dist.all_reduce(torch.ones(10 + RANK), group=g)
            elif kind == "dtype":
                dist.all_reduce(torch.ones(10, dtype=torch.float32 if RANK == 0 else torch.float64), group=g)
            elif kind == "split":
                # Each rank's splits are consistent with themselves (its block to
                # itself agrees), but ranks >= 1 send rank 0 one row where it expects two.
                splits = [2] * WORLD if RANK == 0 else [1] + [2] * (WORLD - 2) + [3]
                dist.all_to_all_single(torch.empty(2 * WORLD), torch.ones(2 * WORLD), splits, splits, group=g)
        except dist.DistBackendError as e:
            print(f"{kind}: ERROR: {e}", flush=True)
            try:
                dist.all_reduce(torch.ones(1), group=g)
                raise AssertionError("a failed communicator accepted another collective")
            except dist.DistBackendError as again:
                assert "unusable after an earlier error" in str(again), again
            continue
        raise AssertionError(f"{kind}: no error")
    t = torch.ones(3)
    dist.all_reduce(t)
    assert torch.all(t == WORLD)
    dist.destroy_process_group()


def sc_missing_peer():
    """Rank WORLD-1 never starts; the others must fail within the timeout."""
    t0 = time.monotonic()
    try:
        init(timeout_s=float(ARGS[0]))
    except Exception as e:  # noqa: BLE001  the type is DistBackendError; print it for the test
        print(f"ERROR after {time.monotonic() - t0:.1f}s: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(3)
    sys.exit(0)


def sc_absent_in_collective():
    """Everyone joins; the last rank then never calls all_reduce."""
    init(timeout_s=float(ARGS[0]))
    dist.barrier()
    if RANK == WORLD - 1:
        time.sleep(float(ARGS[0]) * 3)
        sys.exit(0)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(10))
    except dist.DistBackendError as e:
        print(f"ERROR after {time.monotonic() - t0:.1f}s: {e}", file=sys.stderr)
        sys.exit(3)
    sys.exit(0)


def sc_sigkill():
    """Rank ARGS[1] SIGKILLs itself in the middle of a stream of all_reduces; the
    others must fail fast (liveness), well within the long timeout."""
    init(timeout_s=float(ARGS[0]))
    victim = int(ARGS[1])
    t = torch.ones(100000)
    for i in range(20):
        if RANK == victim and i == 10:
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.monotonic()
        try:
            dist.all_reduce(t)
        except dist.DistBackendError as e:
            print(f"ERROR after {time.monotonic() - t0:.1f}s: {e}", file=sys.stderr)
            sys.exit(3)
    sys.exit(0)


def sc_exception_exit():
    """A rank raises (uncaught) after a few collectives: segments must be gone anyway."""
    init()
    t = torch.ones(10)
    dist.all_reduce(t)
    if RANK == 0:
        raise RuntimeError("user code failed on purpose")
    sys.exit(0)


def sc_job_value():
    """One of two simultaneous jobs: allreduce a job-specific value many times."""
    init()
    base = float(ARGS[0])
    for i in range(200):
        t = torch.full((1000,), base + RANK)
        dist.all_reduce(t)
        want = sum(base + q for q in range(WORLD))
        assert torch.all(t == want), f"job {base} iteration {i}: got {t[0].item()} want {want}"
    dist.destroy_process_group()


_STORE = []


def tcp_init(timeout_s: float = TIMEOUT_S, same_store: bool = False):
    """init_process_group as users write it: init_method tcp://, or one store
    object passed to every round (same_store)."""
    if same_store:
        if not _STORE:
            _STORE.append(dist.TCPStore("127.0.0.1", PORT, WORLD, RANK == 0, timeout=datetime.timedelta(seconds=30)))
        dist.init_process_group("fastpar", store=_STORE[0], rank=RANK, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=timeout_s))
        return
    dist.init_process_group("fastpar", init_method=f"tcp://127.0.0.1:{PORT}", rank=RANK, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=timeout_s))


def error_exit(t0: float, e: Exception):
    print(f"ERROR after {time.monotonic() - t0:.1f}s: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    sys.exit(3)


def sc_recreate():
    """ARGS[0] rounds of init_process_group(init_method=tcp://..., or the same
    store object when ARGS[2] is 'same_store') / one call of ARGS[1]
    ('direct': dist.all_reduce then fastpar.distributed.all_reduce; 'p2p':
    isend / recv of 2 MiB) / destroy_process_group."""
    rounds, kind = int(ARGS[0]), ARGS[1]
    same_store = ARGS[2:] == ["same_store"]
    for i in range(rounds):
        tcp_init(same_store=same_store)
        t = torch.full((1000,), float(RANK + i))
        dist.all_reduce(t)
        want = sum(q + i for q in range(WORLD))
        assert torch.all(t == want), f"round {i}: dist.all_reduce gave {t[0].item()}, want {want}"
        if kind == "direct":
            fd.all_reduce(t)
            assert torch.all(t == want * WORLD), f"round {i}: direct all_reduce gave {t[0].item()}"
        elif kind == "p2p":
            n = (2 << 20) // 4
            if RANK == 0:
                dist.isend(torch.full((n,), float(i)), 1).wait()
            elif RANK == 1:
                got = torch.empty(n)
                dist.recv(got, 0)
                assert torch.all(got == float(i)), f"round {i}: received {got[0].item()}"
        else:
            raise ValueError(kind)
        dist.destroy_process_group()
        if not same_store and RANK != 0:
            # torch's own race, not fastpar's (gloo fails the same loop): a rank
            # that re-inits through tcp:// before rank 0 has torn its TCPStore
            # server down connects to the old server and loses it mid-rendezvous.
            time.sleep(1.0)
        print(f"round {i} ok", flush=True)


def sc_any_source_sender_dies():
    """3 ranks. Rank 1 streams 1 MiB messages to rank 0 and SIGKILLs itself
    after a few; rank 2 sends its part and stays in the group (ARGS[1] 'stay')
    or leaves it and exits (ARGS[1] 'leave'). Rank 0 receives from any source:
    it must fail at once naming rank 1, not wait for the timeout (ARGS[0])."""
    timeout_s, rank2 = float(ARGS[0]), ARGS[1]
    init(timeout_s=timeout_s)
    dist.barrier()
    n = (1 << 20) // 4
    if RANK == 1:
        for i in range(1000):
            if i == 5:
                os.kill(os.getpid(), signal.SIGKILL)
            dist.send(torch.full((n,), 1.0), 0)
    if RANK == 2:
        for _ in range(2):
            dist.send(torch.full((n,), 2.0), 0)
        if rank2 == "leave":
            dist.destroy_process_group()
            sys.exit(0)
        time.sleep(8)  # in the group, alive, while rank 0 must notice rank 1
        sys.exit(0)
    got = torch.empty(n)
    counts = {1: 0, 2: 0}
    t0 = time.monotonic()
    try:
        for _ in range(1000):
            t0 = time.monotonic()
            src = dist.recv(got)
            counts[src] += 1
    except dist.DistBackendError as e:
        print(f"received {counts}", flush=True)
        error_exit(t0, e)
    sys.exit(0)


def sc_any_source_sender_leaves():
    """3 ranks: rank 2 sends one message, leaves the group and exits; rank 1
    sends its messages only after that. Rank 0 receives all of them from any
    source: a peer that left cleanly is not a failure."""
    init()
    n = 1000
    if RANK == 2:
        dist.send(torch.full((n,), 2.0), 0)
        dist.destroy_process_group()
        sys.exit(0)
    if RANK == 1:
        time.sleep(1.5)  # rank 2 has left and exited by now
        for _ in range(3):
            dist.send(torch.full((n,), 1.0), 0)
        dist.destroy_process_group()
        sys.exit(0)
    got = torch.empty(n)
    srcs = []
    for _ in range(4):
        srcs.append(dist.recv(got))
        assert torch.all(got == float(srcs[-1])), (srcs, got[0].item())
    assert sorted(srcs) == [1, 1, 1, 2], srcs
    print("any source ok", flush=True)
    dist.destroy_process_group()


def sc_hier_exit():
    """Ranks on 2 fake hosts (FASTPAR_HOST_ID): a few collectives and point to
    point, then exit with the group destroyed (ARGS[0] 'destroy') or not
    ('keep'): every rank must exit, none may hang."""
    init()
    assert fd.get_fastpar_backend().hierarchical
    for i in range(3):
        t = torch.full((1000,), float(RANK + i))
        dist.all_reduce(t)
        assert torch.all(t == sum(q + i for q in range(WORLD))), t[0].item()
    if RANK == 0:
        dist.send(torch.ones(10), WORLD - 1)
    elif RANK == WORLD - 1:
        got = torch.empty(10)
        dist.recv(got, 0)
        assert torch.all(got == 1)
    dist.barrier()
    if ARGS[0] == "destroy":
        dist.destroy_process_group()
    print("hier exit ok", flush=True)


def _p2p_block_bytes(chunk: int) -> int:
    head = 128 + 4 * 64  # counters, 4 chunk headers (shm_p2p.cpp)
    return (head + 4 * chunk + 4095) // 4096 * 4096


def sc_bad_chunk_header():
    """Rank 0 writes a malformed chunk header into its own channel to rank 1
    and posts it (as a corrupted or hostile process could); rank 1's receive
    must fail naming rank 0. One subgroup per kind of damage (ARGS)."""
    init()
    chunk = int(os.environ["FASTPAR_SHM_P2P_CHUNK_BYTES"])
    arena_bytes = int(os.environ["FASTPAR_SHM_REGISTERED_BYTES"])
    for kind in ARGS:
        g = dist.new_group([0, 1])
        # The group's first registered tensor starts the arena (collective);
        # the channel blocks follow the arena.
        arena = fd.registered_empty((1,), torch.uint8, group=g)
        if RANK == 0:
            block = arena.data_ptr() + arena_bytes + 1 * _p2p_block_bytes(chunk)
            hdr = (ctypes.c_int64 * 4).from_address(block + 128)  # tag, total, offset, bytes
            fields = {"huge_bytes": (0, 4000, 0, 1 << 40), "bytes_past_chunk": (0, 4000, 0, chunk + 64),
                      "negative_total": (0, -5, 0, 16), "offset_past_total": (0, 4000, 1 << 40, 16),
                      "past_message": (0, 100, 0, 200), "first_chunk_offset": (0, 4000, 64, 16)}[kind]
            for i, v in enumerate(fields):
                hdr[i] = v
            ctypes.memset(block + 128 + 32, 0x41, 32)  # an unterminated description
            ctypes.c_uint64.from_address(block).value = 1  # posted: one chunk
        else:
            t0 = time.monotonic()
            try:
                dist.recv(torch.empty(1000), 0, group=g)
                raise AssertionError(f"{kind}: the malformed chunk was accepted")
            except dist.DistBackendError as e:
                print(f"{kind}: ERROR after {time.monotonic() - t0:.1f}s: {e}", flush=True)
        dist.barrier()  # the default group still works: only g's channel was damaged
    print("bad headers ok", flush=True)
    dist.destroy_process_group()


def sc_small_shm():
    """Run under a small /dev/shm: collectives, point to point, registered
    tensors; ARGS[0] bytes of registered tensor must fail with the reservation
    error (ValueError on every rank), and the group must still work after it."""
    init()
    t = torch.full((1 << 20,), float(RANK))  # 4 MiB: several slots
    dist.all_reduce(t)
    assert torch.all(t == sum(range(WORLD)))
    n = (2 << 20) // 4
    if RANK == 0:
        dist.send(torch.ones(n), 1)
    elif RANK == 1:
        got = torch.empty(n)
        dist.recv(got, 0)
        assert torch.all(got == 1)
    r = fd.registered_empty((4 << 20,), torch.uint8)  # 4 MiB fits
    r.fill_(RANK)
    dist.all_reduce(r)
    assert torch.all(r == sum(range(WORLD)) % 256)
    del r
    try:
        fd.registered_empty((int(ARGS[0]),), torch.uint8)
        raise AssertionError("a registered tensor larger than /dev/shm was allocated")
    except ValueError as e:
        print(f"ERROR: {e}", flush=True)
    t = torch.ones(10)
    dist.all_reduce(t)
    assert torch.all(t == WORLD)
    print("small shm ok", flush=True)
    dist.destroy_process_group()


def sc_small_shm_init():
    """Init under a /dev/shm too small for the segments (the test sets large slots)."""
    t0 = time.monotonic()
    try:
        init()
    except dist.DistBackendError as e:
        error_exit(t0, e)
    sys.exit(0)


def sc_small_shm_ddp():
    """fastpar DDP under a small /dev/shm with buckets larger than it: the
    buckets fall back to ordinary tensors (one warning) and training works."""
    import warnings

    import fastpar

    init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.Linear(4096, 1024))  # 32 MiB of grads
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ddp = fastpar.DistributedDataParallel(model, bucket_cap_mb=1000)
    msgs = [str(w.message) for w in caught if "fall back to ordinary tensors" in str(w.message)]
    assert len(msgs) == 1, [str(w.message) for w in caught]
    print(f"WARNING: {msgs[0]}", flush=True)
    assert ddp.bucket_storage_kind == "torch.empty", ddp.bucket_storage_kind
    x = torch.randn(8, 1024) + RANK
    ddp(x).sum().backward()
    g = model[0].weight.grad.clone()
    dist.all_reduce(g, op=dist.ReduceOp.MAX)
    h = model[0].weight.grad.clone()
    dist.all_reduce(h, op=dist.ReduceOp.MIN)
    assert torch.equal(g, h), "ranks hold different averaged gradients"
    print("small shm ddp ok", flush=True)
    dist.destroy_process_group()
