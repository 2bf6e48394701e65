"""Open MPI's MPI_Allreduce (float32 SUM, in place on a NumPy array, through
mpi4py) timed the way the fastpar benchmarks time themselves: per size, the
slowest rank's mean per call, best of `repeats`. Open MPI runs in its own
processes under mpirun (shared memory between the ranks of a host, TCP
between hosts).

    from mpi_baseline import mpi_sweep, mpi_sweep_hosts
    us = mpi_sweep([4096, 1 << 20], ranks=2)   # one host: {bytes: seconds} or None
    got = mpi_sweep_hosts(hs, [2, 2], [4096])  # hosts of tests/multihost/netns_hosts.py

None where mpirun or mpi4py is missing (missing() says which), or the run
failed (said on stderr).

Across hosts made of namespaces, mpirun runs in the switch's network namespace
(a login node that reaches every host) and starts one orted per host through
the hosts' rsh agent (ssh's stand-in: nsenter into that host's namespaces),
each from mpirun itself (no tree spawn: an orted inside a host cannot see the
other hosts' processes to enter them). Its TCP (the BTL between hosts and the
runtime's out-of-band channel) is held to the hosts' links; ranks of one host
use shared memory (vader, in that host's /dev/shm). Its session directories
are in the hosts' tmpdir, removed with them however the run ends.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time


def missing() -> str | None:
    """What Open MPI runs lack here (a sentence), or None."""
    if not shutil.which("mpirun"):
        return "mpirun (Open MPI) is not on PATH"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return f"mpi4py is not installed for {sys.executable}"
    return None


def available() -> bool:
    return missing() is None


def _spec(sizes: list[int], repeats: int, budget_s: float, max_iters: int) -> str:
    return json.dumps({"sizes": sizes, "repeats": repeats, "budget_s": budget_s, "max_iters": max_iters})


def _result(p: subprocess.Popen, timeout_s: float) -> dict | None:
    """Waits for mpirun and reads rank 0's MPI_SWEEP line."""
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()  # the orteds lose their lifeline to mpirun and exit with their ranks
        out, err = p.communicate()
        err += f"\nmpirun still ran after {timeout_s} s"
    for line in out.splitlines():
        if line.startswith("MPI_SWEEP "):
            got = json.loads(line[len("MPI_SWEEP "):])
            for k in ("seconds", "sum"):
                got[k] = {int(b): v for b, v in got[k].items()}
            return got
    print(f"Open MPI run failed (rc {p.returncode}): {err[-2000:]}", file=sys.stderr)
    return None


def mpi_sweep(sizes: list[int], ranks: int, repeats: int = 3, budget_s: float = 0.25,
              max_iters: int = 20000, timeout_s: float = 900) -> dict[int, float] | None:
    """Open MPI on this host: {bytes: seconds}."""
    if not available():
        return None
    # --oversubscribe only where needed: it also switches Open MPI to yielding
    # while it waits, which would handicap it. By default it binds ranks to cores.
    over = ["--oversubscribe"] if ranks > (os.cpu_count() or 1) else []
    cmd = ["mpirun", "--allow-run-as-root", *over, "-n", str(ranks), sys.executable, os.path.abspath(__file__),
           _spec(sizes, repeats, budget_s, max_iters)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    got = _result(p, timeout_s)
    return got["seconds"] if got else None


def mpirun_hosts_argv(hs, ranks_per_host: list[int]) -> list[str]:
    """mpirun over the hosts of `hs` (a netns_hosts.Hosts), for
    hs.popen_switch(): ranks_per_host[h] ranks in host h, in that order
    (ranks 0.. in host 0). No binding: the hosts share this machine's cores,
    and Open MPI (told so by the slots) yields while it waits, as it does on
    any oversubscribed node."""
    if len(ranks_per_host) != len(hs.hosts) or min(ranks_per_host) < 1:
        raise ValueError(f"mpirun_hosts_argv: ranks_per_host is {ranks_per_host} but must have one count of at "
                         f"least 1 for each of the {len(hs.hosts)} hosts")
    hosts = ",".join(f"{h.ip}:{n}" for h, n in zip(hs.hosts, ranks_per_host))
    return ["mpirun", "--allow-run-as-root", "--host", hosts, "-n", str(sum(ranks_per_host)), "--map-by", "slot",
            "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1",
            "--mca", "plm_rsh_agent", " ".join(hs.rsh_agent()), "--mca", "plm_rsh_no_tree_spawn", "1",
            "--mca", "btl", "tcp,self,vader", "--mca", "btl_tcp_if_include", hs.ifname,
            "--mca", "oob_tcp_if_include", hs.cidr, "--mca", "orte_tmpdir_base", hs.tmpdir]


def mpi_sweep_hosts(hs, ranks_per_host: list[int], sizes: list[int], repeats: int = 1, budget_s: float = 0.4,
                    max_iters: int = 200, timeout_s: float = 900) -> dict | None:
    """Open MPI across the hosts of `hs` (a netns_hosts.Hosts): {"seconds":
    {bytes: seconds}, "sum": {bytes: what each rank's all_reduce of (its rank
    + 1) gave, when every element on every rank had it, else null}, "hosts":
    [each rank's hostname]}."""
    if not available():
        return None
    cmd = mpirun_hosts_argv(hs, ranks_per_host) + [sys.executable, os.path.abspath(__file__),
                                                   _spec(sizes, repeats, budget_s, max_iters)]
    p = hs.popen_switch(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return _result(p, timeout_s)


def _worker(spec: dict) -> None:
    """One rank under mpirun; rank 0 prints MPI_SWEEP {"seconds": {bytes:
    seconds}, "sum": {bytes: value or null}, "hosts": [hostname per rank]}."""
    import socket

    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    seconds, sums = {}, {}
    for nbytes in spec["sizes"]:
        buf = np.ones(max(1, nbytes // 4), dtype=np.float32)

        def run(iters: int) -> float:
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            return comm.allreduce((time.perf_counter() - t0) / iters, op=MPI.MAX)

        run(2)  # warm: page faults, caches
        iters = int(max(3, min(spec["max_iters"], spec["budget_s"] / max(run(1), 1e-7))))
        seconds[nbytes] = min(run(iters) for _ in range(spec["repeats"]))
        # the value: every rank gives rank + 1, so every element must be world (world + 1) / 2
        buf.fill(rank + 1)
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        first = comm.bcast(float(buf[0]), root=0)
        same = comm.allreduce(bool(np.all(buf == first)), op=MPI.LAND)
        sums[nbytes] = first if same else None
    hosts = comm.gather(socket.gethostname(), root=0)
    if rank == 0:
        print("MPI_SWEEP " + json.dumps({"seconds": seconds, "sum": sums, "hosts": hosts}), flush=True)


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]))
