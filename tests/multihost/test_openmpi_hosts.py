"""Open MPI across hosts made of namespaces (netns_hosts.py), the launch that
benchmarks/bench_hosts.py times Open MPI with (benchmarks/mpi_baseline.py):
mpirun in the switch's namespace, an orted started in each host through the
hosts' rsh agent, TCP between the hosts on their links, shared memory inside
each. Needs root (the hosts) and mpirun + mpi4py; skipped, naming what is
missing, elsewhere.

- MPI_Allreduce over 2 hosts x 2 ranks gives the right value in every element
  on every rank, and each rank ran in its own host (its hostname);
- nothing is left, after a run or after the hosts are closed in the middle of
  one: no network namespace, no orted or rank, nothing in any host's /dev/shm,
  no Open MPI session directory.
"""
from __future__ import annotations

import os
import select
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import netns_hosts  # noqa: E402
from bench_import import benchmark_module  # noqa: E402
from netns_hosts import Hosts  # noqa: E402

mpi_baseline = benchmark_module("mpi_baseline")

MISSING = netns_hosts.missing() or mpi_baseline.missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"Open MPI across hosts: {MISSING}")


def processes_in(hs: Hosts) -> dict[int, list[str]]:
    """Per host, the command of every process in its network namespace but
    the harness's own (unshare and the init that holds the namespaces)."""
    out = {}
    for h in hs.hosts:
        pids = subprocess.run(["ip", "netns", "pids", h.netns], capture_output=True, text=True).stdout.split()
        cmds = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/cmdline") as f:
                    cmd = f.read().replace("\0", " ").strip()
            except OSError:  # exited meanwhile
                continue
            if not cmd.startswith(("unshare ", "sleep infinity")):
                cmds.append(cmd)
        out[h.index] = cmds
    return out


def assert_nothing_left(hs: Hosts, tag: str, marks: list[str]) -> None:
    """No namespace, tmpdir or host of `hs` is left, and no process whose
    command line has one of `marks`."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert tag not in names, names
    assert not os.path.exists(hs.tmpdir), os.listdir(hs.tmpdir)
    deadline = time.monotonic() + 5  # a killed init is reaped a moment later
    for h in hs.hosts:  # its init held the host's pid, IPC and mount namespaces (its /dev/shm)
        while os.path.exists(f"/proc/{h.init_pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{h.init_pid}"), f"host {h.index}'s init (pid {h.init_pid}) is alive"
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    left = [line for line in ps.splitlines() if any(m in line for m in marks)]
    assert not left, left


def read_until(p: subprocess.Popen, word: str, n: int, within: float) -> str:
    """p's stdout until `word` came `n` times or `within` s passed (read from
    the pipe itself: a buffered readline would hide data from select; mpirun
    forwards its ranks' lines as they come, so they may interleave)."""
    text, deadline, fd = "", time.monotonic() + within, p.stdout.fileno()
    while text.count(word) < n and select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        text += chunk.decode()
    return text


def settled(hs: Hosts, within: float = 5) -> dict[int, list[str]]:
    """processes_in(hs) once no process but the harness's is left in any host
    (the orteds exit a moment after mpirun returns), or after `within` s."""
    deadline = time.monotonic() + within
    while any((running := processes_in(hs)).values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return running


def test_allreduce_across_two_hosts():
    names = [f"mpi{os.getpid()}h{i}" for i in range(2)]
    hs = Hosts(2, rate="1gbit", hostnames=names).open()
    # the orteds have the agent's host -> pid mapping on their command lines (mpirun's MCA parameters)
    tag, marks = hs._tag, [hs.rsh_agent()[-1], hs.tmpdir]
    try:
        sizes = [4096, 1 << 20]
        got = mpi_baseline.mpi_sweep_hosts(hs, [2, 2], sizes, budget_s=0.05, max_iters=20, timeout_s=120)
        assert got is not None, "mpirun across the hosts failed (its stderr is above)"
        assert got["sum"] == {s: 1.0 + 2 + 3 + 4 for s in sizes}, got  # rank r gives r + 1
        assert got["hosts"] == [names[0], names[0], names[1], names[1]], got
        assert all(t > 0 for t in got["seconds"].values()), got
        running = settled(hs)
        assert running == {0: [], 1: []}, running
        for h in range(2):
            assert hs.shm_entries(h) == [], f"host {h}'s /dev/shm keeps {hs.shm_entries(h)}"
        assert os.listdir(hs.tmpdir) == [], os.listdir(hs.tmpdir)  # Open MPI removed its session directories
    finally:
        hs.close()
    assert_nothing_left(hs, tag, marks)


def test_nothing_left_when_closed_mid_run():
    """The hosts closed while mpirun, its orteds and the ranks run (a failed or
    timed-out benchmark): their processes, session directories and shared
    memory go with the hosts."""
    hs = Hosts(2, rate="1gbit").open()
    code = ("from mpi4py import MPI; import numpy as np, time; b = np.ones(1 << 18, np.float32); "
            "MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, b); print('allreduced', flush=True); time.sleep(300)")
    tag, marks = hs._tag, [hs.rsh_agent()[-1], hs.tmpdir, code]
    try:
        p = hs.popen_switch(mpi_baseline.mpirun_hosts_argv(hs, [2, 2]) + [sys.executable, "-c", code],
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
        seen = read_until(p, "allreduced", 4, within=60)
        assert seen.count("allreduced") == 4, (seen, p.poll())
        running = processes_in(hs)
        for h in range(2):
            assert sum("orted" in c for c in running[h]) == 1, running
            assert sum("allreduced" in c for c in running[h]) == 2, running
            assert [e for e in hs.shm_entries(h) if e.startswith("vader_segment")], hs.shm_entries(h)
        assert os.listdir(hs.tmpdir), "Open MPI's session directories are expected in the hosts' tmpdir"
    finally:
        hs.close()
    assert p.wait(timeout=10) is not None
    assert_nothing_left(hs, tag, marks)
