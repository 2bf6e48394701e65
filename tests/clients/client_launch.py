"""Starts one client program in 2 processes as torchrun would (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the
environment, and MASTER_PORT_2 for a second group), bounded by a timeout after which every rank is killed by its
own pid, and returns each rank's exit code and output."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_client(script: str, tmp_path, world: int = 2, timeout: float = 150.0, env: dict | None = None):
    """Runs tests/clients/<script> on `world` ranks; fails with every rank's output unless all exit 0."""
    port, port2 = free_port(), free_port()
    procs = []
    for rank in range(world):
        e = dict(os.environ)
        e["PYTHONPATH"] = ROOT + os.pathsep + HERE + os.pathsep + e.get("PYTHONPATH", "")
        e.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), MASTER_PORT_2=str(port2), OMP_NUM_THREADS="1",
                 GLOO_SOCKET_IFNAME="lo", CLIENT_TMP=str(tmp_path))
        e.update(env or {})
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, script)], env=e, cwd=str(tmp_path),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + timeout
    outs = []
    for rank, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            out, _ = p.communicate()
            out += f"\n[launch] rank {rank} killed after {timeout} s"
        outs.append((p.returncode, out))
    bad = [f"--- rank {r} rc={rc}\n{out[-6000:]}" for r, (rc, out) in enumerate(outs) if rc != 0]
    assert not bad, f"{script} failed:\n" + "\n".join(bad)
    return [out for _, out in outs]
