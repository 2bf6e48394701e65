"""Runs a scenario in N processes of dist_worker.py (TCPStore on 127.0.0.1) and
collects each rank's exit code and output. Every process is bounded by a
timeout and killed (by its own pid) if it overruns, so a hang fails the test
instead of hanging CI.

A scenario is a function of a test module marked @scenario, next to the tests
that check it; a test launches it by the function itself (run(sc_NAME, 2));
each rank's process imports the test module by path and calls it."""
from __future__ import annotations

import os
import socket
import inspect
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Union

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


# Every scenario of the test modules imported in this process, by reference
# ("tests/c10d/test_p2p.py:sc_direct", the path from the repository root).
SCENARIOS: dict[str, Callable[[], None]] = {}


def scenario(fn: Callable[[], None]) -> Callable[[], None]:
    """Marks fn (sc_NAME, no arguments: it reads its rank, world and ARGS from
    worker_context) as a scenario that runs in each rank's process, so that a
    test can launch it and the worker can find it by its module's path and
    its name."""
    path = os.path.relpath(os.path.realpath(inspect.getsourcefile(fn)), os.path.realpath(ROOT))
    fn.scenario_ref = f"{path}:{fn.__name__}"
    SCENARIOS[fn.scenario_ref] = fn
    return fn


def scenario_ref(body: Union[Callable[[], None], str]) -> str:
    """What the worker's command line names: a @scenario function's reference
    (or a reference or "batch" as given)."""
    if isinstance(body, str):
        return body
    assert hasattr(body, "scenario_ref"), f"{body.__name__} is not marked @scenario"
    return body.scenario_ref


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


def launch(body, world: int, ranks=None, env=None, per_rank_env=None, args=(), port=None, worker=WORKER):
    """Starts `body` (a @scenario function, or "batch") on ranks (default: all)."""
    port = port or free_port()
    procs = {}
    for r in ranks if ranks is not None else range(world):
        e = child_env(env)
        if per_rank_env:
            e.update(per_rank_env(r))
        procs[r] = subprocess.Popen(
            [sys.executable, worker, scenario_ref(body), str(r), str(world), str(port), *map(str, args)],
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


def run(body, world: int, timeout: float = 90.0, **kw) -> list[RankResult]:
    return collect(launch(body, world, **kw), timeout)


def assert_ok(results: list[RankResult]) -> None:
    bad = [r for r in results if r.rc != 0]
    assert not bad, "\n".join(f"rank {r.rank} rc={r.rc}\n{r.out}\n{r.err}" for r in bad)
