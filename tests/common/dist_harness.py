"""Runs a scenario of dist_worker.py in N processes (TCPStore on 127.0.0.1) and
collects each rank's exit code and output. Every process is bounded by a
timeout and killed (by its own pid) if it overruns, so a hang fails the test
instead of hanging CI."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "dist_worker.py")
PREFIX = "fastpar_"


@dataclass
class RankResult:
    rank: int
    rc: int
    out: str
    err: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_entries() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if f.startswith(PREFIX)}


def child_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env["OMP_NUM_THREADS"] = "1"  # 2-core CI: one thread per rank
    env.update(extra or {})
    return env


def launch(scenario: str, world: int, ranks=None, env=None, per_rank_env=None, args=(), port=None, worker=WORKER):
    port = port or free_port()
    procs = {}
    for r in ranks if ranks is not None else range(world):
        e = child_env(env)
        if per_rank_env:
            e.update(per_rank_env(r))
        procs[r] = subprocess.Popen(
            [sys.executable, worker, scenario, str(r), str(world), str(port), *map(str, args)],
            env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
    return procs


def collect(procs, timeout: float = 90.0) -> list[RankResult]:
    deadline = time.monotonic() + timeout
    results = []
    for r, p in procs.items():
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs.values():
                if q.poll() is None:
                    q.kill()
            out, err = p.communicate()
            err += f"\n[harness] rank {r} killed after {timeout} s"
        results.append(RankResult(r, p.returncode, out, err))
    return results


def run(scenario: str, world: int, timeout: float = 90.0, **kw) -> list[RankResult]:
    return collect(launch(scenario, world, **kw), timeout)


def assert_ok(results: list[RankResult]) -> None:
    bad = [r for r in results if r.rc != 0]
    assert not bad, "\n".join(f"rank {r.rank} rc={r.rc}\n{r.out}\n{r.err}" for r in bad)
