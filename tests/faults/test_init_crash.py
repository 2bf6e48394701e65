"""A rank that dies during init (SIGKILL, SIGTERM as torchrun sends, SIGINT) at
every phase of it leaves nothing in /dev/shm, and the surviving rank raises
DistBackendError (within the group's timeout: the harness kills any process
that overruns, which fails the test). A rank pauses at a named phase through
FASTPAR_TEST_INIT_PAUSE="<phase>:<file>" (shm_comm.cpp), and the test signals
it once <file> exists. When no rank survives, the next group on the host
removes what the dead ranks left."""
import os
import signal
import subprocess
import sys
import time

import pytest

from dist_harness import child_env

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "init_crash_worker.py")
# The phases of ShmComm's constructor, in order: before anything is published;
# the ProcessId announced, nothing created; the segment created, its name not
# yet published (no peer can have mapped it); published, peers may be mapping
# it; this rank mapped every segment, before the barrier after which names are
# unlinked; after that barrier.
PHASES = ["start", "announced", "created", "published", "mapped", "ready"]
SIGNALS = [signal.SIGKILL, signal.SIGTERM, signal.SIGINT]
TIMEOUT_S = 8  # the group's timeout: phases where the dead rank is unknown wait it out


def _entries_of(pids) -> set[str]:
    marks = tuple(f"_p{p}_" for p in pids)
    return {f for f in os.listdir("/dev/shm") if f.startswith("fastpar_") and any(m in f for m in marks)}


def _master_store():
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def _launch(rank, port, env=None, extra=()):
    return subprocess.Popen([sys.executable, WORKER, str(rank), "2", str(port), str(TIMEOUT_S), *extra],
                            env=child_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path, procs, limit=120.0):
    deadline = time.monotonic() + limit
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"no rank reached the pause ({path})"
        assert all(p.poll() is None for p in procs), "a rank exited before the pause"
        time.sleep(0.02)


def _finish(procs, limit=120.0):
    out = {}
    for r, p in procs.items():
        try:
            o, e = p.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            for q in procs.values():
                if q.poll() is None:
                    q.kill()
            o, e = p.communicate()
            e += f"\n[test] rank {r} killed after {limit} s"
        out[r] = (p.returncode, o, e)
    return out


@pytest.mark.parametrize("victim", [0, 1])
@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_signal_during_init(sig, phase, victim, tmp_path):
    store = _master_store()
    marker = str(tmp_path / "paused")
    procs = {r: _launch(r, store.port, {"FASTPAR_TEST_INIT_PAUSE": f"{phase}:{marker}"} if r == victim else None)
             for r in (0, 1)}
    pids = [p.pid for p in procs.values()]
    try:
        _wait_for(marker, list(procs.values()))
        procs[victim].send_signal(sig)
        out = _finish(procs)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    survivor = 1 - victim
    rc, o, e = out[survivor]
    assert rc == 3 and "DistBackendError: " in o, f"survivor rc={rc}\n{o}\n{e}"
    assert out[victim][0] != 0 and "killed after" not in out[victim][2], out[victim]  # the signal ended it
    assert _entries_of(pids) == set()


@pytest.mark.parametrize("phase", ["created", "published"])
def test_rank0_serving_the_store_killed(phase, tmp_path):
    # torch's tcp:// init: rank 0 serves the store, so its death also takes the
    # store away from the survivor, which must still fail and clean up.
    from dist_harness import free_port

    port = free_port()
    marker = str(tmp_path / "paused")
    procs = {0: _launch(0, port, {"FASTPAR_TEST_INIT_PAUSE": f"{phase}:{marker}"}, ["--rank0-store"]),
             1: _launch(1, port, None, ["--rank0-store"])}
    pids = [p.pid for p in procs.values()]
    try:
        _wait_for(marker, list(procs.values()))
        procs[0].send_signal(signal.SIGKILL)
        out = _finish(procs)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    rc, o, e = out[1]
    assert rc == 3 and "DistBackendError: " in o, f"survivor rc={rc}\n{o}\n{e}"
    assert _entries_of(pids) == set()


def test_next_group_removes_what_dead_ranks_left(tmp_path):
    # Both ranks are killed with their segments created and nobody left to
    # remove them (as when torchrun SIGTERMs a whole job): the next group on
    # the host removes them, and only them.
    store = _master_store()
    markers = [str(tmp_path / f"paused{r}") for r in (0, 1)]
    procs = {r: _launch(r, store.port, {"FASTPAR_TEST_INIT_PAUSE": f"published:{markers[r]}"}) for r in (0, 1)}
    dead = [p.pid for p in procs.values()]
    try:
        for m in markers:
            _wait_for(m, list(procs.values()))
        for p in procs.values():
            p.send_signal(signal.SIGKILL)
            p.wait()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    left = _entries_of(dead)
    assert len(left) == 2, left  # what this fix is for: nobody survived to clean
    store = _master_store()
    procs = {r: _launch(r, store.port) for r in (0, 1)}
    out = _finish(procs)
    for r, (rc, o, e) in out.items():
        assert rc == 0 and "OK" in o, f"rank {r} rc={rc}\n{o}\n{e}"
    assert _entries_of(dead) == set()
    assert _entries_of([p.pid for p in procs.values()]) == set()
