"""Open MPI's MPI_Allreduce (float32 SUM, in place on a NumPy array, through
mpi4py) timed the way the fastpar benchmarks time themselves: per size, the
slowest rank's mean per call, best of `repeats`. Open MPI runs in its own
processes under mpirun (shared memory between them).

    from mpi_baseline import mpi_sweep
    us = mpi_sweep([4096, 1 << 20], ranks=2)   # {bytes: seconds} or None

None where mpirun or mpi4py is missing, or the run failed (said on stderr).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time


def available() -> bool:
    if not shutil.which("mpirun"):
        return False
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def mpi_sweep(sizes: list[int], ranks: int, repeats: int = 3, budget_s: float = 0.25,
              max_iters: int = 20000, timeout_s: float = 900) -> dict[int, float] | None:
    if not available():
        return None
    # --oversubscribe only where needed: it also switches Open MPI to yielding
    # while it waits, which would handicap it. By default it binds ranks to cores.
    over = ["--oversubscribe"] if ranks > (os.cpu_count() or 1) else []
    cmd = ["mpirun", "--allow-run-as-root", *over, "-n", str(ranks), sys.executable, os.path.abspath(__file__),
           json.dumps({"sizes": sizes, "repeats": repeats, "budget_s": budget_s, "max_iters": max_iters})]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    for line in out.stdout.splitlines():
        if line.startswith("MPI_SWEEP "):
            return {int(k): v for k, v in json.loads(line[len("MPI_SWEEP "):]).items()}
    print(f"Open MPI run failed (rc {out.returncode}): {out.stderr[-400:]}", file=sys.stderr)
    return None


def _worker(spec: dict) -> None:
    """One rank under mpirun; rank 0 prints MPI_SWEEP {bytes: seconds}."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    out = {}
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
        out[nbytes] = min(run(iters) for _ in range(spec["repeats"]))
    if comm.Get_rank() == 0:
        print("MPI_SWEEP " + json.dumps(out), flush=True)


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]))
