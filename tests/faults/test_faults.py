"""Faults: a missing peer, a peer that stops calling, a SIGKILLed peer, ranks
that disagree, two jobs side by side, and /dev/shm hygiene in every case.
Errors must come within the timeout, never a hang (the harness kills any
process that overruns, which fails the test)."""
from __future__ import annotations

import ctypes
import datetime
import os
import re
import signal
import sys
import time

import pytest
import torch
import torch.distributed as dist

import fastpar.distributed as fd
from dist_harness import assert_ok, collect, free_port, launch, run, scenario
from worker_context import ARGS, PORT, RANK, TIMEOUT_S, WORLD, error_exit, finish, init

pytestmark = pytest.mark.usefixtures("no_leftover_segments")


def _elapsed(err: str) -> float:
    m = re.search(r"ERROR after ([0-9.]+)s", err)
    assert m, err
    return float(m.group(1))


@scenario
def sc_missing_peer():
    """Rank WORLD-1 never starts; the others must fail within the timeout."""
    t0 = time.monotonic()
    try:
        init(timeout_s=float(ARGS[0]))
    except Exception as e:  # noqa: BLE001  any type, printed: the test requires DistBackendError
        print(f"ERROR after {time.monotonic() - t0:.1f}s: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(3)
    sys.exit(0)


def test_peer_never_arrives():
    # rank 1 of 2 is never started: rank 0 fails in init, naming rank and
    # timeout, with the error torch's backends raise for a peer that failed
    (r0,) = run(sc_missing_peer, 2, ranks=[0], args=[2])
    assert r0.rc == 3, r0.err
    assert "DistBackendError: fastpar: init on rank 0 timed out after 2000 ms waiting for rank 1" in r0.err, r0.err


@scenario
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


def test_peer_never_calls_the_collective():
    results = run(sc_absent_in_collective, 2, args=[2])
    r0 = results[0]
    assert r0.rc == 3, r0.err
    assert "fastpar: allreduce on rank 0 timed out after 2000 ms waiting for rank 1" in r0.err
    assert results[1].rc == 0


@scenario
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


@pytest.mark.parametrize("victim", [0, 1])
def test_sigkill_mid_collective(victim):
    # a 60 s timeout: the survivors must notice the death itself, not the timeout
    results = run(sc_sigkill, 3, args=[60, victim], timeout=50)
    for r in results:
        if r.rank == victim:
            assert r.rc == -9, (r.rc, r.err)
            continue
        assert r.rc == 3, (r.rank, r.rc, r.err)
        assert "fastpar: allreduce on rank" in r.err
        assert f"rank {victim} (pid" in r.err or f"rank {victim} failed" in r.err or "aborted" in r.err, r.err
        assert "timeout 60000 ms" in r.err, r.err
        assert _elapsed(r.err) < 30


MISMATCHES = {
    "op": "called allreduce(count=10, dtype=float32, op=SUM, schedule=one_shot) but rank 1 called "
          "broadcast(count=10, dtype=float32, root=0)",
    "size": "allreduce(count=10, dtype=float32, op=SUM, schedule=one_shot) but rank 1 called "
            "allreduce(count=11,",
    "dtype": "dtype=float32, op=SUM, schedule=one_shot) but rank 1 called allreduce(count=10, dtype=float64",
    "split": "rank 0 sends 8 bytes to this rank but output split 0 expects 4 bytes",
}


@scenario
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


def test_mismatched_calls():
    results = run(sc_mismatch, 2, args=list(MISMATCHES))
    assert_ok(results)
    for kind, fragment in MISMATCHES.items():
        lines = [line for r in results for line in r.out.splitlines() if line.startswith(f"{kind}: ERROR")]
        assert len(lines) == 2, (kind, [r.out for r in results])
        assert any(fragment in line for line in lines), (kind, lines)
        if kind != "split":
            assert all("collective mismatch" in line for line in lines), lines


@scenario
def sc_exception_exit():
    """A rank raises (uncaught) after a few collectives: segments must be gone anyway."""
    init()
    t = torch.ones(10)
    dist.all_reduce(t)
    if RANK == 0:
        raise RuntimeError("user code failed on purpose")
    sys.exit(0)


def test_exception_exit_leaves_nothing():
    results = run(sc_exception_exit, 2)
    assert results[0].rc != 0 and "user code failed on purpose" in results[0].err
    assert results[1].rc == 0


@scenario
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


def test_two_jobs_never_share_segments():
    a = launch(sc_job_value, 2, args=[100], port=free_port())
    b = launch(sc_job_value, 2, args=[1000], port=free_port())
    assert_ok(collect(a) + collect(b))


# -- group life cycles, receives from any source, hostile peers ------------------------------

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


@scenario
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


@pytest.mark.parametrize("kind,store", [("direct", "tcp"), ("direct", "same_store"), ("p2p", "same_store")])
def test_default_group_recreated(kind, store):
    # 3 rounds of init_process_group / one dist.all_reduce and a direct
    # all_reduce, or a 2 MiB isend / recv / destroy_process_group, through
    # init_method="tcp://..." or one TCPStore object passed to every round (its
    # keys outlive the groups): every round must come up on fresh keys and
    # segments, and the direct call must not keep the last group alive.
    results = run(sc_recreate, 2, args=[3, kind, store], timeout=90)
    assert_ok(results)
    for r in results:
        assert "round 2 ok" in r.out, r.out


@scenario
def sc_failure_in_a_coalescing_block():
    """2 ranks; rank 1 SIGKILLs itself after a barrier. Rank 0's next
    all_reduce raises (the communicator fails); then its calls inside
    coalescing blocks (batch_isend_irecv; a coalescing manager around
    collectives) must raise at the block's wait(), not inside the block:
    torch leaves a block that raises half open, and the group's next calls
    would silently not run. Those next calls, sync and async, must raise."""
    init(timeout_s=60)
    dist.barrier()
    if RANK == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.ones(1000)
    try:
        while True:  # rank 1's death may take a moment to show
            dist.all_reduce(t)
    except dist.DistBackendError as e:
        print(f"first: {str(e).splitlines()[0]}", flush=True)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, t, 1), dist.P2POp(dist.irecv, torch.empty(1000), 1)])
    print("batch_isend_irecv returned", flush=True)
    for req in reqs:
        try:
            req.wait()
        except dist.DistBackendError as e:
            print(f"batch wait: {str(e).splitlines()[0]}", flush=True)
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        dist.all_reduce(t)
        dist.all_reduce(t)
    print("coalescing manager returned", flush=True)
    try:
        cm.wait()
    except dist.DistBackendError as e:
        print(f"manager wait: {str(e).splitlines()[0]}", flush=True)
    for async_op in (False, True):
        try:
            work = dist.all_reduce(t, async_op=async_op)
            if async_op:
                work.wait()
            print(f"all_reduce(async_op={async_op}) did not raise", flush=True)
        except dist.DistBackendError as e:
            print(f"all_reduce(async_op={async_op}): {str(e).splitlines()[0]}", flush=True)
    dist.destroy_process_group()


def test_failure_in_a_coalescing_block_raises_at_wait():
    r0, r1 = run(sc_failure_in_a_coalescing_block, 2, timeout=60)
    assert r1.rc == -signal.SIGKILL, r1.err
    assert r0.rc == 0, r0.err
    assert "first: fastpar: allreduce on rank 0" in r0.out, r0.out
    lines = r0.out.splitlines()
    # Each block returned, and its wait raised; the group's later calls ran (and raised).
    for what in ["batch_isend_irecv returned", "batch wait: fastpar",
                 "coalescing manager returned", "manager wait: fastpar: ",
                 "all_reduce(async_op=False): fastpar: ", "all_reduce(async_op=True): fastpar: "]:
        assert any(line.startswith(what) for line in lines), f"{what!r} not in\n{r0.out}\n{r0.err}"
    assert "did not raise" not in r0.out, r0.out


@scenario
def sc_any_source_sender_dies():
    """3 ranks. Rank 1 streams 1 MiB messages to rank 0 and SIGKILLs itself
    after a few; rank 2 sends its part and stays in the group (ARGS[1] 'stay')
    or leaves it and exits (ARGS[1] 'leave'). Rank 0 receives from any source:
    it must fail at once naming rank 1, not wait for the timeout (ARGS[0])."""
    timeout_s, rank2 = float(ARGS[0]), ARGS[1]
    store = init(timeout_s=timeout_s)
    dist.barrier()
    n = (1 << 20) // 4
    if RANK == 1:
        for i in range(1000):
            if i == 5:
                # Only once rank 2 is done sending: a send still in flight when
                # rank 0 fails would (rightly) fail with rank 0's abort.
                store.wait(["any_source/rank2_done"])
                os.kill(os.getpid(), signal.SIGKILL)
            dist.send(torch.full((n,), 1.0), 0)
    if RANK == 2:
        for _ in range(2):
            dist.send(torch.full((n,), 2.0), 0)
        if rank2 == "leave":
            dist.destroy_process_group()
            store.set("any_source/rank2_done", "1")
            sys.exit(0)
        store.set("any_source/rank2_done", "1")
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


@pytest.mark.parametrize("rank2", ["stay", "leave"])
def test_any_source_receive_fails_when_a_sender_dies(rank2):
    # Rank 1 is SIGKILLed while streaming 1 MiB messages to rank 0, which is in
    # recv() from any source; rank 2 either stays in the group (alive, sending
    # nothing more) or leaves it. Rank 0 raises at once naming rank 1, not
    # after the 60 s timeout.
    results = run(sc_any_source_sender_dies, 3, args=[60, rank2], timeout=50)
    assert results[1].rc == -9, results[1].err
    r0 = results[0]
    assert r0.rc == 3, (r0.rc, r0.err)
    assert "fastpar.recv on rank 0: rank 1 (pid" in r0.err, r0.err
    assert "exited without leaving the group while this rank waited for a message from any source" in r0.err, r0.err
    assert "timeout 60000 ms" in r0.err, r0.err
    assert _elapsed(r0.err) < 5, r0.err
    assert results[2].rc == 0, results[2].err


def wait_exited(pid: int, within: float = 20.0) -> None:
    """Until process `pid` has exited: gone, or a zombie its launcher has not
    reaped yet."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} still running after {within} s")


@scenario
def sc_any_source_sender_leaves():
    """3 ranks: rank 2 sends one message, leaves the group and exits; rank 1
    sends its messages only after that. Rank 0 receives all of them from any
    source: a peer that left cleanly is not a failure."""
    store = init()
    n = 1000
    if RANK == 2:
        dist.send(torch.full((n,), 2.0), 0)
        dist.destroy_process_group()
        store.set("any_source/rank2_pid", str(os.getpid()))
        sys.exit(0)
    if RANK == 1:
        wait_exited(int(store.get("any_source/rank2_pid")))
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


def test_any_source_receive_outlives_a_sender_that_left():
    # Rank 2 sends, leaves the group (destroy_process_group) and exits before
    # rank 1 sends: rank 0's receives from any source still get every message.
    results = run(sc_any_source_sender_leaves, 3, timeout=60)
    assert_ok(results)
    assert "any source ok" in results[0].out


BAD_HEADERS = ["huge_bytes", "bytes_past_chunk", "negative_total", "offset_past_total", "past_message",
               "first_chunk_offset"]


def _p2p_block_bytes(chunk: int) -> int:
    head = 128 + 4 * 64  # counters, 4 chunk headers (shm_p2p.cpp)
    return (head + 4 * chunk + 4095) // 4096 * 4096


@scenario
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


def test_malformed_chunk_header_names_the_peer():
    # A peer that writes nonsense into its channel (corrupted or hostile): the
    # receiver raises naming it instead of crashing, for each kind of damage.
    env = {"FASTPAR_SHM_P2P_CHUNK_BYTES": "1024", "FASTPAR_SHM_REGISTERED_BYTES": str(1 << 20)}
    results = run(sc_bad_chunk_header, 2, env=env, args=BAD_HEADERS, timeout=90)
    assert_ok(results)
    lines = [line for line in results[1].out.splitlines() if ": ERROR" in line]
    assert [line.split(":")[0] for line in lines] == BAD_HEADERS, results[1].out
    for line in lines:
        assert "fastpar.recv on rank 1: rank 0 (pid" in line and "left a malformed point-to-point channel" in line, line
    assert "bad headers ok" in results[1].out


def _engine_with_store(store, rank: int, size: int = 2, timeout_ms: int = 3000):
    """fastpar's shared-memory engine for `rank` (where a group's segments are
    made and mapped), built on a store the test controls."""
    import fastpar

    return fastpar._C.ShmEngine(store, rank, size, list(range(size)), timeout_ms)


@pytest.mark.parametrize("value", ["victim_{pid}", "../victim_{pid}", "fastpar_0123456789abcdef_r1_p{pid}",
                                   "fastpar_{job}_r0_p{pid}", "fastpar_{job}_r1_p0{pid}", "fastpar_{job}_r1_p"])
def test_segment_names_from_the_store_are_checked(value):
    # Rank 1's segment name, as rank 0 reads it from the store, is another
    # program's /dev/shm entry, another job's name or not rank 1's: rank 0
    # refuses it naming rank 1 and the value, and neither opens nor unlinks it.
    import threading

    import torch.distributed as dist

    victim = f"victim_{os.getpid()}"
    with open(f"/dev/shm/{victim}", "w") as f:
        f.write("someone else's")
    try:
        store = dist.HashStore()
        errors = []

        def rank0():
            try:
                _engine_with_store(store, 0)
            except Exception as e:  # noqa: BLE001  checked below
                errors.append(e)

        t = threading.Thread(target=rank0)
        t.start()
        store.wait(["job"])
        bad = value.format(pid=os.getpid(), job=store.get("job").decode())
        store.set("seg/1", bad)
        t.join(30)
        assert not t.is_alive()
        assert len(errors) == 1, errors
        msg = str(errors[0])
        assert type(errors[0]).__name__ == "DistBackendError", repr(errors[0])
        assert f"the store's segment name for rank 1 (key 'seg/1') is '{bad}'" in msg, msg
        assert "neither opened nor unlinked" in msg, msg
        assert os.path.exists(f"/dev/shm/{victim}")
    finally:
        os.unlink(f"/dev/shm/{victim}")


def test_job_id_from_the_store_is_checked():
    import torch.distributed as dist

    store = dist.HashStore()
    store.set("job", "../../etc/x")
    with pytest.raises(dist.DistBackendError, match=r"init on rank 1: the store's job id \(key 'job', written by "
                                                    r"rank 0\) is '../../etc/x', not 16 hex digits"):
        _engine_with_store(store, 1)


@scenario
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


@pytest.mark.parametrize("end", ["destroy", "keep"])
def test_fake_hosts_exit(end):
    # 2 fake hosts (FASTPAR_HOST_ID), collectives and point to point, then exit
    # with the group destroyed or not: every rank exits (the harness kills and
    # fails a rank that hangs).
    results = run(sc_hier_exit, 4, per_rank_env=lambda r: {"FASTPAR_HOST_ID": f"host{r // 2}"},
                  args=[end], timeout=60)
    assert_ok(results)
    assert all("hier exit ok" in r.out for r in results)


@scenario
def sc_hier_leader_fails():
    """Fake hosts (host{r // 2}, or as the test sets them), all_reduce in a
    loop; rank 2 SIGKILLs itself. Each survivor prints when it raised and
    what, stays ARGS[1] s (so that no rank learns of another's failure from
    its exit), calls all_reduce once more and prints what that raised, and
    exits 3."""
    init(timeout_s=float(ARGS[0]))
    assert fd.get_fastpar_backend().hierarchical
    t = torch.ones(1000)
    try:
        for i in range(1000):
            if RANK == 2 and i == 5:
                os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(t.fill_(1))
    except dist.DistBackendError as e:
        print(f"raised at {time.time():.3f}: {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
    time.sleep(float(ARGS[1]))
    try:
        dist.all_reduce(t)
    except dist.DistBackendError as e:
        print(f"again raised: {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
    sys.exit(3)


def test_leader_failing_between_hosts_fails_its_host():
    # Rank 0 (host 0's leader) fails in gloo when rank 2 dies, and aborts host
    # 0's shared memory first: rank 1, waiting for it there, raises at once
    # (not at the 60 s timeout, nor when rank 0 exits 4 s later), naming rank
    # 0 and its error. Every survivor's group stays failed.
    linger = 4
    results = run(sc_hier_leader_fails, 4, per_rank_env=lambda r: {"FASTPAR_HOST_ID": f"host{r // 2}"},
                  args=[60, linger], timeout=50)
    every = "\n".join(f"rank {r.rank} rc={r.rc}\n{r.err}" for r in results)
    assert results[2].rc == -9, every
    for r in results:
        if r.rank != 2:
            assert r.rc == 3 and "raised at" in r.err and "again raised: " in r.err, every
    raised = {r.rank: re.search(r"raised at ([\d.]+): (.*)", r.err).groups() for r in results if r.rank != 2}
    assert "fastpar: all_reduce on rank 0 failed between hosts (gloo): " in raised[0][1], every
    assert re.search(r"rank 0 \(pid \d+\) aborted the communicator: this host's leader failed between hosts: "
                     r"all_reduce on rank 0 failed between hosts \(gloo\): ", raised[1][1]), every
    assert float(raised[1][0]) - float(raised[0][0]) < 1.5, every
    assert "rank 2 (pid" in raised[3][1], every
    # Rank 0 hears of the death from gloo, or first from rank 3 through the failure notice.
    assert re.search(r"again raised: fastpar: all_reduce on rank 0: the communicator is unusable after an earlier "
                     r"error: (all_reduce on rank 0 failed between hosts \(gloo\)|the group failed on another rank): ",
                     results[0].err), every


@pytest.mark.parametrize("poll_ms", ["100", "0"], ids=["notice", "notice-off"])
def test_a_rank_that_fails_and_lives_on_is_heard_of_on_other_hosts(poll_ms):
    # Host A holds rank 0 alone; host B ranks 1 and 2. Rank 2 dies: rank 1
    # (host B's leader) learns it from /proc in its local reduce, raises and
    # stays on for `linger` s. Rank 0 waits for rank 1 in the leaders' gloo
    # all_reduce, where nothing tells it: gloo's connection to rank 1 is
    # reset only when rank 1 exits. With the failure notice rank 0 finds
    # rank 1's error in the store within a poll interval or two and raises
    # with it; FASTPAR_HOSTS_FAILURE_POLL_MS=0 turns the notice off, and rank 0
    # hears of it from gloo, when rank 1 exits.
    linger = 4
    hosts = "ABB"
    results = run(sc_hier_leader_fails, 3, per_rank_env=lambda r: {"FASTPAR_HOST_ID": f"host{hosts[r]}"},
                  env={"FASTPAR_HOSTS_FAILURE_POLL_MS": poll_ms}, args=[60, linger], timeout=50)
    every = "\n".join(f"rank {r.rank} rc={r.rc}\n{r.err}" for r in results)
    assert results[2].rc == -9, every
    assert all(r.rc == 3 and "again raised: " in r.err for r in results[:2]), every
    raised = {r.rank: re.search(r"raised at ([\d.]+): (.*)", r.err).groups() for r in results[:2]}
    assert re.search(r"fastpar: reduce on rank 1: rank 2 \(pid \d+\) exited while this rank waited", raised[1][1]), \
        every
    late = float(raised[0][0]) - float(raised[1][0])
    if poll_ms == "0":
        assert "the group failed on another rank" not in results[0].err, every
        assert late > linger - 1, f"rank 0 raised {late:.3f} s after rank 1, before rank 1 exited\n{every}"
        print(f"notice off: rank 0 raised {late:.3f} s after rank 1")
        return
    assert late < 1.5, f"rank 0 raised {late:.3f} s after rank 1\n{every}"
    print(f"notice on: rank 0 raised {late:.3f} s after rank 1")
    assert re.search(r"fastpar: all_reduce on rank 0 failed between hosts \(gloo\): the communicator is unusable after "
                     r"an earlier error: the group failed on another rank: reduce on rank 1: rank 2 \(pid \d+\) "
                     r"exited while this rank waited", raised[0][1]), every
    assert "again raised: fastpar: all_reduce on rank 0: the communicator is unusable after an earlier error: " \
        "the group failed on another rank: " in results[0].err, every


@scenario
def sc_own_wait_limit():
    """Fake hosts A and B. Rank 1 comes to an all_to_all_single 3 s late;
    rank 0 waits for its Work with a limit of 0.5 s, which raises, then
    waits again without one. A wait's own limit is not the group's failure:
    nothing is written to the failure notice, the call completes and the
    group goes on."""
    init(timeout_s=60)
    out, inp = torch.zeros(WORLD), torch.full((WORLD,), float(RANK))
    if RANK == 1:
        time.sleep(3)
    work = dist.all_to_all_single(out, inp, async_op=True)
    if RANK == 0:
        try:
            work.wait(timeout=datetime.timedelta(seconds=0.5))
            raise AssertionError("a wait of 0.5 s for a peer 3 s late returned")
        except dist.DistBackendError as e:
            assert "timed out" in str(e).lower(), e
            print(f"own limit raised: {str(e).splitlines()[0]}", flush=True)
    work.wait()
    assert torch.equal(out, torch.arange(WORLD, dtype=torch.float32)), out
    t = torch.ones(3)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((3,), float(WORLD))), t
    print("group went on", flush=True)
    finish()


def test_the_limit_of_a_wait_does_not_fail_the_group():
    results = run(sc_own_wait_limit, 2, per_rank_env=lambda r: {"FASTPAR_HOST_ID": f"host{'AB'[r]}"}, timeout=60)
    assert_ok(results)
    assert "own limit raised" in results[0].out, results[0].out
    assert all("group went on" in r.out for r in results), [r.out for r in results]
