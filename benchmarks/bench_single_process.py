"""Single-process allreduce over k tensors: fastpar beside a torch baseline and
the memory-copy ceiling, all measured in the same run.

CPU (always):   baseline = torch.stack(ts).sum(0) then a copy into each tensor
                ceiling  = the fastest plain copy of the same bytes (k buffers in,
                           k buffers out) this machine does: torch's copy_ of one
                           flat buffer or fastpar's parallel memcpy
GPU (>= 2 GPUs): baseline = torch.cuda.nccl.all_reduce on the same tensors

Bytes counted for every column: k inputs read + k outputs written = 2 * k * size.

  python benchmarks/bench_single_process.py --quick          # ~1 minute
  python benchmarks/bench_single_process.py --csv out.csv --plot out.png
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fastpar  # noqa: E402
from report import Progress, human_bytes, plot_lines, print_table, time_it, write_csv  # noqa: E402

KiB, MiB = 1024, 1024 * 1024


def cpu_rows(sizes, ks, min_time):
    rows = []
    prog = Progress(len(sizes) * len(ks), "cpu allreduce")
    for k in ks:
        for size in sizes:
            numel = size // 4
            ts = [torch.randn(numel) for _ in range(k)]
            flat_src, flat_dst = torch.randn(k * numel), torch.empty(k * numel)
            copies_src = [torch.randn(numel) for _ in range(k)]
            copies_dst = [torch.empty(numel) for _ in range(k)]

            def baseline():
                r = torch.stack(ts).sum(0)
                for t in ts:
                    t.copy_(r)

            t_fast = time_it(lambda: fastpar.allreduce(ts), min_time)
            t_base = time_it(baseline, min_time)
            t_copy = min(time_it(lambda: flat_dst.copy_(flat_src), min_time),
                         time_it(lambda: torch.ops.fastpar.copy_many_(copies_src, copies_dst), min_time))
            nbytes = 2 * k * size
            fast, base, ceil = nbytes / t_fast / 1e9, nbytes / t_base / 1e9, nbytes / t_copy / 1e9
            rows.append({"device": "cpu", "k": k, "size": human_bytes(size), "bytes": size,
                         "fastpar_us": t_fast * 1e6, "fastpar_GBps": fast, "baseline_GBps": base,
                         "copy_ceiling_GBps": ceil, "vs_baseline": fast / base, "of_ceiling": fast / ceil})
            prog.step(f"k={k} {human_bytes(size)}")
    return rows


def gpu_rows(sizes, ks, min_time):
    import torch.cuda.nccl as nccl

    rows = []
    ndev = torch.cuda.device_count()
    ks = [k for k in ks if k <= ndev]
    sync = torch.cuda.synchronize
    for k in ks:
        for size in sizes:
            ts = [torch.randn(size // 4, device=f"cuda:{i}") for i in range(k)]
            t_fast = time_it(lambda: fastpar.allreduce(ts), min_time, sync=lambda: [torch.cuda.synchronize(i) for i in range(k)])
            t_nccl = time_it(lambda: nccl.all_reduce(ts), min_time, sync=lambda: [torch.cuda.synchronize(i) for i in range(k)])
            nbytes = 2 * k * size
            fast, base = nbytes / t_fast / 1e9, nbytes / t_nccl / 1e9
            rows.append({"device": "cuda", "k": k, "size": human_bytes(size), "bytes": size,
                         "fastpar_us": t_fast * 1e6, "fastpar_GBps": fast, "nccl_GBps": base,
                         "vs_baseline": fast / base})
    del sync
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer sizes and shorter timing (about a minute)")
    p.add_argument("--ks", default="2,4,8", help="list lengths (tensors per allreduce)")
    p.add_argument("--min-size", type=int, default=4 * KiB)
    p.add_argument("--max-size", type=int, default=256 * MiB)
    p.add_argument("--csv", default="bench_out/single_process.csv")
    p.add_argument("--plot", default="bench_out/single_process.png")
    args = p.parse_args(argv)

    ks = [int(k) for k in args.ks.split(",")]
    max_size = min(args.max_size, 64 * MiB) if args.quick else args.max_size
    step = 4 if args.quick else 2
    sizes, s = [], args.min_size
    while s <= max_size:
        sizes.append(s)
        s *= step
    min_time = 0.05 if args.quick else 0.3
    if args.quick:
        ks = [k for k in ks if k <= 4] or ks[:1]

    print(f"fastpar {fastpar.__version__} single-process allreduce, float32, SUM; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; GB/s counts 2*k*size bytes (k read + k written); best of 7 samples")
    rows = cpu_rows(sizes, ks, min_time)
    print_table(rows, ["k", "size", "fastpar_us", "fastpar_GBps", "baseline_GBps", "copy_ceiling_GBps",
                       "vs_baseline", "of_ceiling"],
                "CPU: fastpar.allreduce vs torch.stack(ts).sum(0)+copies, and the copy ceiling")
    if torch.cuda.is_available() and torch.cuda.device_count() >= 2 and fastpar.cuda_built():
        grows = gpu_rows(sizes, ks, min_time)
        print_table(grows, ["k", "size", "fastpar_us", "fastpar_GBps", "nccl_GBps", "vs_baseline"],
                    "CUDA: fastpar.allreduce vs torch.cuda.nccl.all_reduce")
        rows += grows
    else:
        print("\n(no CUDA comparison: needs >= 2 GPUs and a CUDA build of fastpar)")
    big = [r for r in rows if r["device"] == "cpu" and r["bytes"] >= MiB]
    if big:
        print(f"\nCPU, sizes >= 1 MiB: fastpar reaches {min(r['of_ceiling'] for r in big):.2f}-"
              f"{max(r['of_ceiling'] for r in big):.2f} of the copy ceiling and "
              f"{min(r['vs_baseline'] for r in big):.2f}-{max(r['vs_baseline'] for r in big):.2f}x the baseline")
    write_csv(rows, args.csv)
    series = {}
    for r in rows:
        if r["device"] != "cpu":
            continue
        series.setdefault(f"fastpar k={r['k']}", []).append((r["bytes"], r["fastpar_GBps"]))
        series.setdefault(f"torch baseline k={r['k']}", []).append((r["bytes"], r["baseline_GBps"]))
        series.setdefault(f"copy ceiling k={r['k']}", []).append((r["bytes"], r["copy_ceiling_GBps"]))
    plot_lines(series, args.plot, "bytes per tensor", "GB/s (2*k*size / time)",
               "single-process allreduce on the CPU")
    return rows


if __name__ == "__main__":
    main()
