"""Where the time of a small dist.all_reduce goes, layer by layer, in one run.

    python benchmarks/bench_latency.py                # 2 ranks, 4 KiB float32
    python benchmarks/bench_latency.py --bytes 4 --ranks 4

Every row is the same in-place float32 SUM, timed as a tight loop of calls
(best of --repeats runs of the slowest rank's mean):

  gloo                  dist.all_reduce on a gloo group of all ranks (baseline)
  fastpar               dist.all_reduce on the fastpar world group
  fastpar, 1-rank group dist.all_reduce on a fastpar group holding only this
                        rank: torch.distributed's own cost per call (Python
                        wrapper, ProcessGroup, dispatcher, Work) with no
                        communication at all: the floor for any backend
  pg.allreduce          ProcessGroup.allreduce(...).wait(): no Python wrapper
  backend.allreduce     fastpar's C++ backend object called directly
  transport             backend.allreduce minus its 1-rank time: what fastpar
                        itself spends per call (copy, flags, reduce)
"""
from __future__ import annotations

import argparse
import datetime
import time

from launch import add_rank_options, run_or_launch


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    import fastpar  # noqa: F401  (registers the backend)
    import fastpar.distributed as fd

    torch.set_num_threads(1)
    rank, n = args.rank, args.ranks
    store = dist.TCPStore("127.0.0.1", args.port, n, rank == 0, timeout=datetime.timedelta(seconds=60),
                          wait_for_workers=False)
    dist.init_process_group("fastpar", store=store, rank=rank, world_size=n, timeout=datetime.timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    alone = [dist.new_group([r], backend="fastpar") for r in range(n)][rank]
    world_be, alone_be = fd.get_fastpar_backend(), fd.get_fastpar_backend(alone)
    world_pg = dist.group.WORLD
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    t = torch.ones(max(1, args.bytes // 4), dtype=torch.float32)

    def timed(fn, iters) -> float:
        """Seconds per call on the slowest rank, best of --repeats."""
        best = float("inf")
        for _ in range(args.repeats):
            for _ in range(max(10, iters // 10)):
                fn()
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            dt = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=gloo)
            best = min(best, dt.item())
        return best

    rows = {
        "gloo": timed(lambda: dist.all_reduce(t, group=gloo), max(50, args.iters // 100)),
        "fastpar": timed(lambda: dist.all_reduce(t), args.iters),
        "fastpar, 1-rank group": timed(lambda: dist.all_reduce(t, group=alone), args.iters),
        "pg.allreduce": timed(lambda: world_pg.allreduce([t], opts).wait(), args.iters),
        "backend.allreduce": timed(lambda: world_be.allreduce([t], opts).wait(), args.iters),
        "backend.allreduce, 1-rank": timed(lambda: alone_be.allreduce([t], opts).wait(), args.iters),
    }
    rows["transport"] = rows["backend.allreduce"] - rows["backend.allreduce, 1-rank"]
    if rank == 0:
        report(rows, args)
    dist.destroy_process_group()


def report(rows: dict, args) -> None:
    fp = rows["fastpar"]
    print(f"\nall_reduce of {max(4, args.bytes // 4 * 4)} bytes float32 SUM, {args.ranks} ranks: "
          f"time per call (slowest rank), best of {args.repeats}")
    print(f"{'path':<28} {'us/call':>9} {'share of fastpar':>17}")
    for name, sec in rows.items():
        print(f"{name:<28} {sec * 1e6:>9.2f} {sec / fp:>16.2f}x")
    print(f"\nfastpar is {rows['gloo'] / fp:.0f}x faster than gloo; torch.distributed's own per-call cost "
          f"(1-rank group) is {rows['fastpar, 1-rank group'] / fp:.0%} of fastpar's time.")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_rank_options(p)
    p.add_argument("--bytes", type=int, default=4096, help="message size (rounded down to float32 elements)")
    p.add_argument("--iters", type=int, default=20000, help="calls per timed run (gloo: 1/100 of it)")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    run_or_launch(p, args, worker, __file__)


if __name__ == "__main__":
    main()
