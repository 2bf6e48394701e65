"""The CPU reduce loop on each instruction set: scalar, AVX2, AVX-512 (what
fastpar picks at run time, forced with FASTPAR_CPU_ISA), for float32, bfloat16
and float16, in the same run.

Each ISA runs in its own process (the choice is made once per process); the
processes take turns (scalar, avx2, avx512, scalar, ...) for --rounds rounds
so a noisy neighbour slows every ISA alike, and each point keeps its median
over the rounds. One thread, k tensors allreduced in place by the list op
fastpar.allreduce (the same element loop as the shared-memory backend).
GB/s counts 2*k*size bytes (k read + k written).

    python benchmarks/bench_cpu_isa.py                 # ~1 minute
    python benchmarks/bench_cpu_isa.py --k 4 --rounds 5 --csv isa.csv
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import human_bytes, print_table, time_it, write_csv  # noqa: E402

KiB, MiB = 1024, 1024 * 1024
DTYPES = ("float32", "bfloat16", "float16")


def child(args) -> None:
    import torch

    import fastpar

    torch.set_num_threads(1)
    out = {"isa": fastpar._C.cpu_isa(), "rows": []}
    for dtype in DTYPES:
        dt = getattr(torch, dtype)
        for size in args.sizes:
            ts = [torch.randn(size // dt.itemsize).to(dt) for _ in range(args.k)]
            for t in ts:
                t.clamp_(-1, 1)  # in-place SUM doubles every call; start small, zeros after overflow are fine
            t = time_it(lambda: fastpar.allreduce(ts), args.min_time)
            out["rows"].append({"dtype": dtype, "bytes": size, "us": t * 1e6})
    print(json.dumps(out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--k", type=int, default=2, help="tensors per allreduce")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sizes", default="65536,1048576,16777216", help="bytes per tensor, comma-separated")
    p.add_argument("--min-time", type=float, default=0.1)
    p.add_argument("--csv", default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    if args.child:
        child(args)
        return

    import fastpar  # the parent only asks which ISAs exist

    best = fastpar._C.cpu_isa_supported()
    every = ["scalar", "avx2", "avx512", "avx512_bf16"]
    isas = every[: every.index(best) + 1]
    times: dict = {}
    for r in range(args.rounds):
        for isa in isas:
            print(f"round {r + 1}/{args.rounds}: {isa}", file=sys.stderr, flush=True)
            env = dict(os.environ, FASTPAR_CPU_ISA=isa, OMP_NUM_THREADS="1")
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--k", str(args.k),
                   "--sizes", ",".join(map(str, args.sizes)), "--min-time", str(args.min_time)]
            res = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)
            assert res["isa"] == isa, res["isa"]
            for row in res["rows"]:
                times.setdefault((row["dtype"], row["bytes"], isa), []).append(row["us"])
    rows = []
    for dtype in DTYPES:
        for size in args.sizes:
            row = {"dtype": dtype, "size": human_bytes(size), "bytes": size}
            med = {isa: statistics.median(times[(dtype, size, isa)]) for isa in isas}
            for isa in isas:
                row[f"{isa}_GBps"] = 2 * args.k * size / med[isa] / 1e3
            for isa in isas[1:]:
                row[f"{isa}_vs_scalar"] = med["scalar"] / med[isa]
            rows.append(row)
    cols = ["dtype", "size"] + [f"{i}_GBps" for i in isas] + [f"{i}_vs_scalar" for i in isas[1:]]
    print_table(rows, cols, f"fastpar.allreduce of k={args.k} CPU tensors in place, SUM, 1 thread: GB/s "
                            f"(median of {args.rounds} interleaved rounds) per ISA; this CPU: {best}")
    if args.csv:
        write_csv(rows, args.csv)


if __name__ == "__main__":
    main()
