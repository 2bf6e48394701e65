"""Starts one process per rank for the multi-process benchmarks: each rank
reruns the benchmark script with --rank R --port P (a free loopback port for
the TCPStore) and the same arguments, with one intra-op thread per rank so
ranks do not fight over cores."""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(script: str, argv: list[str], ranks: int, timeout: float | None = None) -> None:
    """Runs `script argv --rank r --port P` for r in range(ranks); exits with
    an error naming the exit codes if any rank fails, or, when `timeout`
    seconds pass first, kills the ranks still running and exits naming them."""
    port = free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    procs = [subprocess.Popen([sys.executable, os.path.abspath(script), *argv, "--rank", str(r), "--port", str(port)],
                              env=env) for r in range(ranks)]
    deadline = None if timeout is None else time.monotonic() + timeout
    rc = []
    for q in procs:
        try:
            rc.append(q.wait(timeout=None if deadline is None else max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            rc.append(None)
    if None in rc:
        for q in procs:
            if q.poll() is None:
                q.kill()
                q.wait()
        sys.exit(f"benchmark ranks {[r for r, c in enumerate(rc) if c is None]} still ran after {timeout:.0f} s; "
                 "killed")
    if any(rc):
        sys.exit(f"benchmark ranks exited with {rc}")


def add_rank_options(p: argparse.ArgumentParser) -> None:
    """--ranks for users; --rank/--port (hidden) for the processes run_ranks starts."""
    p.add_argument("--ranks", type=int, default=2, help="processes (2 to 8)")
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)


def run_or_launch(p: argparse.ArgumentParser, args, worker, script: str) -> None:
    """In a started rank (--rank given): run `worker(args)`. Otherwise start
    --ranks processes of `script` with this command line."""
    if not 2 <= args.ranks <= 8:
        p.error(f"--ranks is {args.ranks} but must be between 2 and 8")
    if args.rank >= 0:
        worker(args)
    else:
        run_ranks(script, sys.argv[1:], args.ranks)
