"""CPU allreduce against DeepSpeed's shared-memory allreduce, in the same run.

Contenders, 2 ranks (or --ranks) on this host, the same tensor, SUM in place:
  deepspeed  torch.ops.deepspeed.inference_all_reduce_(t): the op behind
             deepspeed.comm.inference_all_reduce with DS_ACCELERATOR=cpu (its
             csrc/cpu/comm/shm.cpp, JIT-compiled on first use)
  fastpar    fastpar.distributed.all_reduce(t): the direct call on a fastpar group
Method: the contenders take turns (interleaved) for --reps repetitions of a
loop lasting about --loop-ms; a point is the median over repetitions of the
per-call time, each repetition's time being the slowest rank's. float32 and
bfloat16, 4 KiB .. 256 MiB. Before timing, every size is checked bitwise
against the reference sum (fp32 accumulation in rank order, one rounding).

busbw = bytes / time * 2(n-1)/n. The second table is fastpar's bfloat16
busbw over its float32 busbw at the same byte size (1.0: half precision costs
nothing over float32).

DeepSpeed is optional. Without it the benchmark says how to install it and
still measures fastpar (both tables' fastpar columns). To install it beside
the torch you already have, without touching that environment:
    pip install --no-deps --no-build-isolation --target ~/ds-pkgs deepspeed \\
        hjson py-cpuinfo msgpack pydantic pydantic-core annotated-types typing-inspection einops nvidia-ml-py
    PYTHONPATH=~/ds-pkgs python benchmarks/bench_deepspeed.py
(the first run JIT-compiles DeepSpeed's shm op, a few minutes).

    python benchmarks/bench_deepspeed.py --csv ds.csv --plot ds.png
    python benchmarks/bench_deepspeed.py --quick          # 4 sizes, fewer repetitions
"""
from __future__ import annotations

import argparse
import csv
import datetime
import glob
import json
import os
import statistics
import sys
import time

from launch import add_rank_options, run_or_launch

KiB, MiB = 1024, 1024 * 1024
INSTALL_HINT = ("DeepSpeed is not installed, so only fastpar is measured. To compare, install it beside this "
                "torch:\n  pip install --no-deps --no-build-isolation --target ~/ds-pkgs deepspeed hjson py-cpuinfo "
                "msgpack pydantic pydantic-core annotated-types typing-inspection einops nvidia-ml-py\n"
                "and run with PYTHONPATH=~/ds-pkgs (DS_ACCELERATOR=cpu is set by this benchmark).")


def human(b: int) -> str:
    for unit, s in (("MiB", MiB), ("KiB", KiB)):
        if b >= s:
            return f"{b // s}{unit}"
    return f"{b}B"


def sizes(quick: bool, lo: int, hi: int) -> list[int]:
    if quick:
        return [s for s in (4 * KiB, 64 * KiB, MiB, 16 * MiB) if lo <= s <= hi]
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 4
    return out


def load_deepspeed(rank: int, n: int, port: int):
    """DeepSpeed's shm allreduce op, or None (not installed). Its shm segment
    names come from MASTER_ADDR/MASTER_PORT; LOCAL_SIZE = world size turns the
    shm path on."""
    os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    os.environ["LOCAL_SIZE"] = str(n)
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(n)
    os.environ["LOCAL_RANK"] = str(rank)
    try:
        import deepspeed  # noqa: F401
        import deepspeed.comm as dscomm
    except ImportError:
        return None, None
    import torch

    dscomm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    if not (hasattr(torch.ops, "deepspeed") and hasattr(torch.ops.deepspeed, "inference_all_reduce_")):
        raise RuntimeError("DeepSpeed is installed but its shm op (ShareMemCommBuilder) did not load")
    return torch.ops.deepspeed.inference_all_reduce_, deepspeed.__version__


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    import fastpar
    import fastpar.distributed as fd

    rank, n = args.rank, args.ranks
    store = dist.TCPStore("127.0.0.1", args.port, n, rank == 0, timeout=datetime.timedelta(seconds=600),
                          wait_for_workers=False)
    # Default group gloo (DeepSpeed's CPU backend builds on it), fastpar in its own group.
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n, timeout=datetime.timedelta(seconds=600))
    fp_group = dist.new_group(backend="fastpar")
    ctl = dist.new_group(backend="gloo")
    ds_op, ds_version = load_deepspeed(rank, n, args.port + 1)
    if ds_op is None and rank == 0:
        print(INSTALL_HINT, file=sys.stderr, flush=True)

    contenders = [("fastpar", lambda t: fd.all_reduce(t, group=fp_group))]
    if ds_op is not None:
        contenders.append(("deepspeed", ds_op))

    def slowest(x: float) -> float:
        v = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(v, op=dist.ReduceOp.MAX, group=ctl)
        return v.item()

    def check(fn, dtype, count, seed) -> bool:
        """Bitwise against fp32 accumulation in rank order, rounded once."""
        g = torch.Generator().manual_seed(seed * 97 + rank)
        x = torch.randn(count, generator=g).to(dtype)
        parts = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(parts, x, group=ctl)
        ref = parts[0].float()
        for p in parts[1:]:
            ref = ref + p.float()
        ref = ref.to(dtype)
        fn(x)
        ok = torch.equal(x.view(torch.int16 if dtype.itemsize == 2 else torch.int32),
                         ref.view(torch.int16 if dtype.itemsize == 2 else torch.int32))
        return bool(slowest(0.0 if ok else 1.0) == 0.0)

    rows = []
    for dtype_name in ("float32", "bfloat16"):
        dtype = getattr(torch, dtype_name)
        for nbytes in sizes(args.quick, args.min_bytes, args.max_bytes):
            count = nbytes // dtype.itemsize
            t = torch.ones(count, dtype=dtype)
            checks = {name: all(check(fn, dtype, count, s) for s in range(args.checks)) for name, fn in contenders}
            iters = {}
            for name, fn in contenders:  # calibrate: calls per ~loop_ms, agreed by all ranks
                fn(t)
                dist.barrier(group=ctl)
                t0 = time.perf_counter()
                fn(t)
                one = slowest(time.perf_counter() - t0)
                iters[name] = int(max(1, min(args.max_iters, args.loop_ms / 1e3 / max(one, 1e-7))))
            samples = {name: [] for name, _ in contenders}
            for _ in range(args.reps):
                for name, fn in contenders:
                    t.fill_(1)  # in-place SUM doubles the data every call; restart from ones
                    dist.barrier(group=ctl)
                    t0 = time.perf_counter()
                    for _ in range(iters[name]):
                        fn(t)
                    samples[name].append(slowest((time.perf_counter() - t0) / iters[name]))
            row = {"dtype": dtype_name, "bytes": nbytes, "ranks": n}
            for name, _ in contenders:
                med = statistics.median(samples[name])
                row[f"{name}_us"] = med * 1e6
                row[f"{name}_busbw_GBps"] = nbytes / med * 2 * (n - 1) / n / 1e9
                row[f"{name}_bitwise_ok"] = checks[name]
            if ds_op is not None:
                row["fastpar_over_deepspeed"] = row["fastpar_us"] / row["deepspeed_us"]
            rows.append(row)
            if rank == 0:
                print(f"  measured {dtype_name} {human(nbytes)}", file=sys.stderr, flush=True)
    if rank == 0:
        report(rows, n, args, ds_version, fastpar._C.cpu_isa())
    dist.barrier(group=ctl)
    dist.destroy_process_group()
    # DeepSpeed names its segments deepspeed_shm_<uid>_<addr>_<port>_<rank> and never unlinks them.
    for path in glob.glob(f"/dev/shm/*_{os.getuid()}_127.0.0.1_{args.port + 1}_{rank}"):
        try:
            os.unlink(path)
        except OSError:
            pass


def report(rows, n, args, ds_version, isa) -> None:
    have_ds = ds_version is not None
    print(f"\nallreduce SUM in place, {n} ranks, CPU; median of {args.reps} interleaved repetitions of a "
          f"~{args.loop_ms:.0f} ms loop, slowest rank; fastpar ISA {isa}"
          + (f"; DeepSpeed {ds_version}" if have_ds else "; DeepSpeed not installed"))
    hdr = f"{'dtype':>9} {'size':>7} {'fastpar us':>11} {'busbw GB/s':>10}"
    if have_ds:
        hdr += f" {'deepspeed us':>12} {'busbw GB/s':>10} {'fastpar/DS':>10}"
    hdr += f" {'bitwise':>8}"
    print(hdr)
    for r in rows:
        line = f"{r['dtype']:>9} {human(r['bytes']):>7} {r['fastpar_us']:>11.1f} {r['fastpar_busbw_GBps']:>10.2f}"
        ok = r["fastpar_bitwise_ok"]
        if have_ds:
            line += (f" {r['deepspeed_us']:>12.1f} {r['deepspeed_busbw_GBps']:>10.2f}"
                     f" {r['fastpar_over_deepspeed']:>10.2f}")
            ok = ok and r["deepspeed_bitwise_ok"]
        print(line + f" {'yes' if ok else 'NO':>8}")
    if have_ds:
        worst = max(r["fastpar_over_deepspeed"] for r in rows)
        print(f"fastpar / DeepSpeed time: worst {worst:.2f} (target <= 0.8 at every size)")
    else:
        print(INSTALL_HINT)
    # bf16 vs fp32 busbw at the same bytes
    f32 = {r["bytes"]: r for r in rows if r["dtype"] == "float32"}
    print(f"\nbfloat16 busbw / float32 busbw at the same size (target >= 0.9 from 64 KiB)")
    print(f"{'size':>7} {'fastpar':>8}" + (f" {'deepspeed':>10}" if have_ds else ""))
    for r in rows:
        if r["dtype"] != "bfloat16" or r["bytes"] not in f32:
            continue
        base = f32[r["bytes"]]
        r["fastpar_bf16_over_fp32_busbw"] = r["fastpar_busbw_GBps"] / base["fastpar_busbw_GBps"]
        line = f"{human(r['bytes']):>7} {r['fastpar_bf16_over_fp32_busbw']:>8.2f}"
        if have_ds:
            r["deepspeed_bf16_over_fp32_busbw"] = r["deepspeed_busbw_GBps"] / base["deepspeed_busbw_GBps"]
            line += f" {r['deepspeed_bf16_over_fp32_busbw']:>10.2f}"
        print(line)
    if args.csv:
        keys = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("dtype", "bytes", "ranks"), k))
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {args.csv}")
    if args.plot:
        plot(rows, have_ds, args.plot)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f)


def plot(rows, have_ds, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for dtype, style in (("float32", "-"), ("bfloat16", "--")):
        rs = [r for r in rows if r["dtype"] == dtype]
        xs = [r["bytes"] for r in rs]
        axes[0].plot(xs, [r["fastpar_busbw_GBps"] for r in rs], style, marker="o", label=f"fastpar {dtype}")
        if have_ds:
            axes[0].plot(xs, [r["deepspeed_busbw_GBps"] for r in rs], style, marker="s", label=f"DeepSpeed {dtype}")
            axes[1].plot(xs, [r["fastpar_over_deepspeed"] for r in rs], style, marker="o", label=dtype)
    axes[0].set(xscale="log", xlabel="bytes", ylabel="busbw GB/s", title="CPU allreduce busbw")
    axes[0].legend()
    if have_ds:
        axes[1].axhline(0.8, color="gray", lw=0.8, ls=":")
        axes[1].axhline(1.0, color="gray", lw=0.8)
        axes[1].set(xscale="log", xlabel="bytes", ylabel="fastpar time / DeepSpeed time",
                    title="fastpar direct call vs DeepSpeed shm op (lower is faster)")
        axes[1].legend()
    else:
        axes[1].text(0.5, 0.5, "DeepSpeed not installed", ha="center", va="center")
        axes[1].set_axis_off()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    print(f"wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_rank_options(p)
    p.add_argument("--min-bytes", type=int, default=4 * KiB)
    p.add_argument("--max-bytes", type=int, default=256 * MiB)
    p.add_argument("--quick", action="store_true", help="4 sizes (4 KiB .. 16 MiB), 3 repetitions")
    p.add_argument("--reps", type=int, default=None, help="repetitions per point (default 7, 3 with --quick)")
    p.add_argument("--loop-ms", type=float, default=40.0, help="length of one timed loop")
    p.add_argument("--max-iters", type=int, default=100000)
    p.add_argument("--checks", type=int, default=2, help="bitwise checks per size and contender")
    p.add_argument("--csv", default=None)
    p.add_argument("--plot", default=None)
    p.add_argument("--json", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.reps is None:
        args.reps = 3 if args.quick else 7
    run_or_launch(p, args, worker, __file__)


if __name__ == "__main__":
    main()
