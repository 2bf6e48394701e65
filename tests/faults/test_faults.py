"""Faults: a missing peer, a peer that stops calling, a SIGKILLed peer, ranks
that disagree, two jobs side by side, and /dev/shm hygiene in every case.
Errors must come within the timeout, never a hang (the harness kills any
process that overruns, which fails the test)."""
import os
import re

import pytest

from dist_harness import assert_ok, collect, free_port, launch, run


pytestmark = pytest.mark.usefixtures("no_leftover_segments")


def _elapsed(err: str) -> float:
    m = re.search(r"ERROR after ([0-9.]+)s", err)
    assert m, err
    return float(m.group(1))


def test_peer_never_arrives():
    # rank 1 of 2 is never started: rank 0 fails in init, naming rank and timeout
    (r0,) = run("missing_peer", 2, ranks=[0], args=[2])
    assert r0.rc == 3, r0.err
    assert "init on rank 0 timed out after 2000 ms waiting for rank 1" in r0.err


def test_peer_never_calls_the_collective():
    results = run("absent_in_collective", 2, args=[2])
    r0 = results[0]
    assert r0.rc == 3, r0.err
    assert "fastpar: allreduce on rank 0 timed out after 2000 ms waiting for rank 1" in r0.err
    assert results[1].rc == 0


@pytest.mark.parametrize("victim", [0, 1])
def test_sigkill_mid_collective(victim):
    # a 60 s timeout: the survivors must notice the death itself, not the timeout
    results = run("sigkill", 3, args=[60, victim], timeout=50)
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


def test_mismatched_calls():
    results = run("mismatch", 2, args=list(MISMATCHES))
    assert_ok(results)
    for kind, fragment in MISMATCHES.items():
        lines = [line for r in results for line in r.out.splitlines() if line.startswith(f"{kind}: ERROR")]
        assert len(lines) == 2, (kind, [r.out for r in results])
        assert any(fragment in line for line in lines), (kind, lines)
        if kind != "split":
            assert all("collective mismatch" in line for line in lines), lines


def test_exception_exit_leaves_nothing():
    results = run("exception_exit", 2)
    assert results[0].rc != 0 and "user code failed on purpose" in results[0].err
    assert results[1].rc == 0


def test_two_jobs_never_share_segments():
    a = launch("job_value", 2, args=[100], port=free_port())
    b = launch("job_value", 2, args=[1000], port=free_port())
    assert_ok(collect(a) + collect(b))


# -- group life cycles, receives from any source, hostile peers ------------------------------

@pytest.mark.parametrize("kind,store", [("direct", "tcp"), ("direct", "same_store"), ("p2p", "same_store")])
def test_default_group_recreated(kind, store):
    # 3 rounds of init_process_group / one dist.all_reduce and a direct
    # all_reduce, or a 2 MiB isend / recv / destroy_process_group, through
    # init_method="tcp://..." or one TCPStore object passed to every round (its
    # keys outlive the groups): every round must come up on fresh keys and
    # segments, and the direct call must not keep the last group alive.
    results = run("recreate", 2, args=[3, kind, store], timeout=90)
    assert_ok(results)
    for r in results:
        assert "round 2 ok" in r.out, r.out


@pytest.mark.parametrize("rank2", ["stay", "leave"])
def test_any_source_receive_fails_when_a_sender_dies(rank2):
    # Rank 1 is SIGKILLed while streaming 1 MiB messages to rank 0, which is in
    # recv() from any source; rank 2 either stays in the group (alive, sending
    # nothing more) or leaves it. Rank 0 raises at once naming rank 1, not
    # after the 60 s timeout.
    results = run("any_source_sender_dies", 3, args=[60, rank2], timeout=50)
    assert results[1].rc == -9, results[1].err
    r0 = results[0]
    assert r0.rc == 3, (r0.rc, r0.err)
    assert "fastpar.recv on rank 0: rank 1 (pid" in r0.err, r0.err
    assert "exited without leaving the group while this rank waited for a message from any source" in r0.err, r0.err
    assert "timeout 60000 ms" in r0.err, r0.err
    assert _elapsed(r0.err) < 5, r0.err
    assert results[2].rc == 0, results[2].err


def test_any_source_receive_outlives_a_sender_that_left():
    # Rank 2 sends, leaves the group (destroy_process_group) and exits before
    # rank 1 sends: rank 0's receives from any source still get every message.
    results = run("any_source_sender_leaves", 3, timeout=60)
    assert_ok(results)
    assert "any source ok" in results[0].out


BAD_HEADERS = ["huge_bytes", "bytes_past_chunk", "negative_total", "offset_past_total", "past_message",
               "first_chunk_offset"]


def test_malformed_chunk_header_names_the_peer():
    # A peer that writes nonsense into its channel (corrupted or hostile): the
    # receiver raises naming it instead of crashing, for each kind of damage.
    env = {"FASTPAR_SHM_P2P_CHUNK_BYTES": "1024", "FASTPAR_SHM_REGISTERED_BYTES": str(1 << 20)}
    results = run("bad_chunk_header", 2, env=env, args=BAD_HEADERS, timeout=90)
    assert_ok(results)
    lines = [line for line in results[1].out.splitlines() if ": ERROR" in line]
    assert [line.split(":")[0] for line in lines] == BAD_HEADERS, results[1].out
    for line in lines:
        assert "fastpar.recv on rank 1: rank 0 (pid" in line and "left a malformed point-to-point channel" in line, line
    assert "bad headers ok" in results[1].out


def _backend_with_store(store, rank: int, size: int = 2, timeout_ms: int = 3000):
    """fastpar's backend for `rank`, built on a store the test controls."""
    import fastpar

    return fastpar._C.Backend(store, rank, size, timeout_ms, list(range(size)), list(range(size)))


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
                _backend_with_store(store, 0)
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
        _backend_with_store(store, 1)


@pytest.mark.parametrize("end", ["destroy", "keep"])
def test_fake_hosts_exit(end):
    # 2 fake hosts (FASTPAR_HOST_ID), collectives and point to point, then exit
    # with the group destroyed or not: every rank exits (the harness kills and
    # fails a rank that hangs).
    results = run("hier_exit", 4, per_rank_env=lambda r: {"FASTPAR_HOST_ID": f"host{r // 2}"},
                  args=[end], timeout=60)
    assert_ok(results)
    assert all("hier exit ok" in r.out for r in results)
