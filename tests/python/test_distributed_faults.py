"""Faults: a missing peer, a peer that stops calling, a SIGKILLed peer, ranks
that disagree, two jobs side by side, and /dev/shm hygiene in every case.
Errors must come within the timeout, never a hang (the harness kills any
process that overruns, which fails the test)."""
import re

import pytest

from dist_harness import assert_ok, collect, free_port, launch, run, shm_entries


@pytest.fixture(autouse=True)
def no_leftover_segments():
    before = shm_entries()
    yield
    assert shm_entries() - before == set(), "fastpar segments left in /dev/shm"


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
    "split": "rank 0 sends 4 bytes to this rank but output split 0 expects 8 bytes",
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
