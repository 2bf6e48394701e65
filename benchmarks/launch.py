"""Starts one process per rank for the multi-process benchmarks: each rank
reruns the benchmark script with --rank R --port P (a free loopback port for
the TCPStore) and the same arguments, with one intra-op thread per rank so
ranks do not fight over cores."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(script: str, argv: list[str], ranks: int) -> None:
    """Runs `script argv --rank r --port P` for r in range(ranks); exits with
    an error naming the exit codes if any rank fails."""
    port = free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    procs = [subprocess.Popen([sys.executable, os.path.abspath(script), *argv, "--rank", str(r), "--port", str(port)],
                              env=env) for r in range(ranks)]
    rc = [q.wait() for q in procs]
    if any(rc):
        sys.exit(f"benchmark ranks exited with {rc}")
