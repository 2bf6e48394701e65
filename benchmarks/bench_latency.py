"""Where the time of a small dist.all_reduce goes, layer by layer, in one run.

    python benchmarks/bench_latency.py                # 2 ranks, 4 KiB float32
    python benchmarks/bench_latency.py --bytes 4 --ranks 4

Every row is the same in-place float32 SUM, timed as a tight loop of calls
(best of --repeats rounds of the slowest rank's mean, the paths interleaved):

  Open MPI              MPI_Allreduce (mpi4py, in place on a NumPy array) under
                        mpirun, when mpirun and mpi4py are installed (baseline)
  gloo                  dist.all_reduce on a gloo group of all ranks (baseline)
  fastpar direct        fastpar.distributed.all_reduce: the direct call
  fastpar               dist.all_reduce on the fastpar world group
  torch fake backend    dist.all_reduce on a group of torch's "fake" backend
                        (torch.testing._internal.distributed.fake_pg), whose
                        allreduce does nothing: torch's own wrapper cost per
                        call (Python, ProcessGroup, dispatcher, its Work)
  fastpar share         fastpar minus torch fake backend: what fastpar's
                        dist.all_reduce costs beyond torch's wrapper, to set
                        against the direct call (target: at most 1.3x of it)
  fastpar, 1-rank group dist.all_reduce on a fastpar group holding only this
                        rank: torch.distributed's own cost per call (Python
                        wrapper, ProcessGroup, dispatcher, Work) with no
                        communication at all: the floor for any backend
  pg.allreduce          ProcessGroup.allreduce(...).wait(): no Python wrapper
  backend.allreduce     fastpar's C++ backend object called directly
  transport             backend.allreduce minus its 1-rank time: what fastpar
                        itself spends per call (copy, flags, reduce)

Open MPI runs first, in its own processes (mpirun), then the torch rows.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

from launch import add_rank_options, run_or_launch


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    # registers torch's "fake" backend
    import torch.testing._internal.distributed.fake_pg  # noqa: F401

    import fastpar  # noqa: F401  (registers the backend)
    import fastpar.distributed as fd

    torch.set_num_threads(1)
    rank, n = args.rank, args.ranks
    store = dist.TCPStore("127.0.0.1", args.port, n, rank == 0, timeout=datetime.timedelta(seconds=60),
                          wait_for_workers=False)
    dist.init_process_group("fastpar", store=store, rank=rank, world_size=n, timeout=datetime.timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    fake = dist.new_group(backend="fake")
    world = dist.group.WORLD
    alone = [dist.new_group([r], backend="fastpar") for r in range(n)][rank]
    world_be, alone_be = fd.get_fastpar_backend(), fd.get_fastpar_backend(alone)
    world_pg = dist.group.WORLD
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    t = torch.ones(max(1, args.bytes // 4), dtype=torch.float32)

    def timed_once(fn, iters) -> float:
        """Seconds per call on the slowest rank, one timed run."""
        for _ in range(max(10, iters // 10)):
            fn()
        dist.barrier(group=gloo)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        dt = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=gloo)
        return dt.item()

    paths = {
        "gloo": (lambda: dist.all_reduce(t, group=gloo), max(50, args.iters // 100)),
        "fastpar direct": (lambda: fd.all_reduce(t), args.iters),
        "fastpar": (lambda: dist.all_reduce(t, group=world), args.iters),
        "torch fake backend": (lambda: dist.all_reduce(t, group=fake), args.iters),
        "fastpar, 1-rank group": (lambda: dist.all_reduce(t, group=alone), args.iters),
        "pg.allreduce": (lambda: world_pg.allreduce([t], opts).wait(), args.iters),
        "backend.allreduce": (lambda: world_be.allreduce([t], opts).wait(), args.iters),
        "backend.allreduce, 1-rank": (lambda: alone_be.allreduce([t], opts).wait(), args.iters),
    }
    # Best of --repeats rounds, each round timing every path once: on a shared
    # machine the load drifts, and interleaving lets every path see it alike
    # (the differences between rows are what the report is about).
    best = {name: float("inf") for name in paths}
    for _ in range(args.repeats):
        for name, (fn, iters) in paths.items():
            best[name] = min(best[name], timed_once(fn, iters))
    rows = {}
    if args.mpi_us is not None:
        rows["Open MPI (mpirun, shared memory)"] = args.mpi_us * 1e-6
    rows.update(best)
    rows["transport"] = rows["backend.allreduce"] - rows["backend.allreduce, 1-rank"]
    rows["fastpar share"] = rows["fastpar"] - rows["torch fake backend"]
    if rank == 0:
        report(rows, args)
        if args.csv:
            import csv
            os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
            with open(args.csv, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["path", "bytes", "ranks", "us_per_call"])
                for name, sec in rows.items():
                    w.writerow([name, max(4, args.bytes // 4 * 4), args.ranks, f"{sec * 1e6:.4f}"])
    dist.destroy_process_group()


def report(rows: dict, args) -> None:
    fp = rows["fastpar"]
    print(f"\nall_reduce of {max(4, args.bytes // 4 * 4)} bytes float32 SUM, {args.ranks} ranks: "
          f"time per call (slowest rank), best of {args.repeats}")
    print(f"{'path':<34} {'us/call':>9} {'share of fastpar':>17}")
    for name, sec in rows.items():
        print(f"{name:<34} {sec * 1e6:>9.2f} {sec / fp:>16.2f}x")
    print(f"\nfastpar is {rows['gloo'] / fp:.0f}x faster than gloo; torch.distributed's own per-call cost "
          f"(1-rank group) is {rows['fastpar, 1-rank group'] / fp:.0%} of fastpar's time; the direct call takes "
          f"{rows['fastpar direct'] / fp:.2f}x of dist.all_reduce's.")
    print(f"fastpar share (fastpar - torch fake backend) / direct call: "
          f"{rows['fastpar share'] / rows['fastpar direct']:.2f}x (target: at most 1.30x)")
    mpi = rows.get("Open MPI (mpirun, shared memory)")
    if mpi:
        print(f"direct call / Open MPI: {rows['fastpar direct'] / mpi:.2f}x; dist.all_reduce / Open MPI: {fp / mpi:.2f}x")
    else:
        print("Open MPI: not measured (needs mpirun and mpi4py; --no-mpi skips it)")


def measure_mpi(args):
    """us per call of Open MPI's allreduce, or None where it is not installed."""
    if args.no_mpi:
        return None
    from mpi_baseline import mpi_sweep

    got = mpi_sweep([args.bytes], args.ranks, repeats=args.repeats, budget_s=1.0, max_iters=args.iters)
    return None if got is None else got[args.bytes] * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_rank_options(p)
    p.add_argument("--bytes", type=int, default=4096, help="message size (rounded down to float32 elements)")
    p.add_argument("--iters", type=int, default=20000, help="calls per timed run (gloo: 1/100 of it)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-mpi", action="store_true", help="skip the Open MPI baseline")
    p.add_argument("--csv", default=None, help="write the table to this CSV file (path, bytes, us_per_call)")
    p.add_argument("--mpi-us", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank < 0 and args.mpi_us is None:
        us = measure_mpi(args)
        if us is not None:
            sys.argv += ["--mpi-us", str(us)]
    run_or_launch(p, args, worker, __file__)


if __name__ == "__main__":
    main()
