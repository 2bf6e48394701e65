"""The GPU benchmark's rows, its targets and its one summary table: pure
Python (no CUDA), so the table, CSV and plots are tested on any machine
(tests/python/test_bench_cuda.py) and bench_cuda.py only measures.

Row kinds (the "part" column):
  lists  fastpar.allreduce over k tensors in one process, beside a baseline
         (torch.stack(ts).sum(0) + copies on one GPU, torch.cuda.nccl.all_reduce
         on distinct GPUs) and the copy ceiling (one device-to-device copy of
         the same bytes); GB/s count k inputs read + k outputs written
  host   host time per call at 4 KiB: N calls, then one synchronize
  ipc    dist.all_reduce across processes (fastpar or NCCL group); algbw =
         bytes / time, busbw = algbw * 2(n-1)/n (nccl-tests' convention)
"""
from __future__ import annotations

import math
import os
import sys
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import human_bytes, plot_lines, print_table, write_csv  # noqa: E402

KiB, MiB = 1024, 1024 * 1024
ONE_GPU = "cuda:0 x k"  # every list entry on cuda:0


def list_row(placement: str, k: int, dtype: str, algorithm: str, size: int, t_fast: float,
             baseline: str, t_base: Optional[float], t_copy: Optional[float], error: str = "") -> Dict:
    nbytes = 2 * k * size
    gbps = (lambda t: nbytes / t / 1e9 if t else float("nan"))
    row = {"part": "lists", "placement": placement, "k": k, "dtype": dtype, "algorithm": algorithm,
           "bytes": size, "size": human_bytes(size), "fastpar_us": t_fast * 1e6 if t_fast else float("nan"),
           "fastpar_GBps": gbps(t_fast), "baseline": baseline, "baseline_GBps": gbps(t_base),
           "copy_GBps": gbps(t_copy), "error": error}
    row["vs_baseline"] = row["fastpar_GBps"] / row["baseline_GBps"]
    row["of_copy"] = row["fastpar_GBps"] / row["copy_GBps"]
    return row


def host_row(call: str, k: int, seconds: Optional[float], error: str = "") -> Dict:
    return {"part": "host", "call": call, "k": k, "bytes": 4 * KiB,
            "host_us": seconds * 1e6 if seconds else float("nan"), "error": error}


def ipc_row(backend: str, placement: str, ranks: int, size: int, seconds: Optional[float],
            host_seconds: Optional[float] = None, error: str = "") -> Dict:
    algbw = size / seconds / 1e9 if seconds else float("nan")
    return {"part": "ipc", "backend": backend, "placement": placement, "ranks": ranks, "bytes": size,
            "size": human_bytes(size), "us": seconds * 1e6 if seconds else float("nan"),
            "host_us": host_seconds * 1e6 if host_seconds else float("nan"),
            "algbw_GBps": algbw, "busbw_GBps": algbw * 2 * (ranks - 1) / ranks, "error": error}


def _ok(values) -> List[float]:
    return [v for v in values if isinstance(v, (int, float)) and not math.isnan(v)]


def _target(name: str, target: str, values: List[float], better: str, bound: float, how: str) -> Dict:
    """One summary line: the worst measured value against the target."""
    vals = _ok(values)
    if not vals:
        return {"target": name, "goal": target, "measured": "not measured", "status": "-", "how": how}
    worst = max(vals) if better == "lower" else min(vals)
    met = worst <= bound if better == "lower" else worst >= bound
    status = "met" if met else "MISSED"
    if len(vals) < len(values):  # some rows of this target failed or were cut by a time limit
        status += f" ({len(vals)} of {len(values)} rows)"
    return {"target": name, "goal": target, "measured": worst, "status": status, "how": how}


def targets(rows: List[Dict]) -> List[Dict]:
    """The issues' targets (issue 9 items 3-4, issue 8 item 3) beside what was measured."""
    lists = [r for r in rows if r["part"] == "lists" and r["placement"] == ONE_GPU]
    host = {(r["call"], r["k"]): r["host_us"] for r in rows if r["part"] == "host"}
    ipc = [r for r in rows if r["part"] == "ipc"]

    def direct(min_b=0, max_b=1 << 62):
        return [r for r in lists if r["algorithm"] == "direct" and min_b <= r["bytes"] <= max_b]

    ring_vs_direct = []
    for r in lists:
        if r["algorithm"] == "ring" and r["bytes"] >= MiB:
            d = [x for x in direct(r["bytes"], r["bytes"]) if x["k"] == r["k"] and x["dtype"] == r["dtype"]]
            if d:
                ring_vs_direct.append(r["fastpar_GBps"] / d[0]["fastpar_GBps"])
    shared = [r for r in ipc if r["backend"] == "fastpar" and r["placement"] == "shared cuda:0" and r["ranks"] == 2]
    distinct = [r for r in ipc if r["placement"] == "distinct GPUs"]
    nccl = {(r["ranks"], r["bytes"]): r["busbw_GBps"] for r in distinct if r["backend"] == "nccl"}
    vs_nccl = [r["busbw_GBps"] / nccl[(r["ranks"], r["bytes"])] for r in distinct
               if r["backend"] == "fastpar" and r["bytes"] >= 64 * MiB and (r["ranks"], r["bytes"]) in nccl]
    # Registered tensors against the copying two-shot of the same size and
    # placement (time ratio; < 1: the zero-copy schedule is faster).
    plain = {(r["placement"], r["ranks"], r["bytes"]): r["us"] for r in ipc if r["backend"] == "fastpar"}
    registered_vs_plain = [r["us"] / plain[(r["placement"], r["ranks"], r["bytes"])] for r in ipc
                           if r["backend"] == "fastpar registered"
                           and (r["placement"], r["ranks"], r["bytes"]) in plain]
    return [
        _target("4 KiB list allreduce, k=2, host us/call", "<= 8", [host.get(("direct", 2))], "lower", 8,
                "issue 9.3"),
        _target("4 KiB list allreduce, k=8, host us/call", "<= 12", [host.get(("direct", 8))], "lower", 12,
                "issue 9.3"),
        _target("ring / direct GB/s from 1 MiB, one GPU (worst)", ">= 0.5", ring_vs_direct, "higher", 0.5,
                "issue 9.3"),
        _target("direct / copy from 16 MiB (worst)", ">= 0.9", [r["of_copy"] for r in direct(16 * MiB)],
                "higher", 0.9, "issue 9.4"),
        _target("direct / copy at 1 MiB (worst)", ">= 0.6", [r["of_copy"] for r in direct(MiB, MiB)],
                "higher", 0.6, "issue 9.4"),
        _target("2 ranks on one GPU, 4 KiB dist.all_reduce host us/call", "<= 8",
                [r["host_us"] for r in shared if r["bytes"] == 4 * KiB], "lower", 8, "issue 8.3"),
        _target("2 ranks on one GPU, 4 KiB all_reduce in a CUDA graph, host us/replay", "<= 8",
                [r["host_us"] for r in ipc if r["backend"] == "fastpar graph" and r["placement"] == "shared cuda:0"
                 and r["ranks"] == 2 and r["bytes"] == 4 * KiB], "lower", 8, "issue 8.3 (graphs)"),
        _target("2 ranks on one GPU, 32 MiB algbw GB/s", ">= 468",
                [r["algbw_GBps"] for r in shared if r["bytes"] == 32 * MiB], "higher", 468, "issue 8.3"),
        _target("distinct GPUs, 256 KiB dist.all_reduce us", "<= 10",
                [r["us"] for r in distinct if r["backend"] == "fastpar" and r["bytes"] == 256 * KiB], "lower", 10,
                "issue 8.3"),
        _target("distinct GPUs, busbw / NCCL from 64 MiB (worst)", ">= 0.9", vs_nccl, "higher", 0.9, "issue 8.3"),
        _target("registered / plain all_reduce time from 1 MiB (worst)", "<= 1", registered_vs_plain, "lower", 1,
                "issue 8.3 (zero-copy)"),
    ]


def errors(rows: List[Dict]) -> List[str]:
    return sorted({f"{r['part']}: {r['error']}" for r in rows if r.get("error")})


def report(rows: List[Dict], out_dir: str, header: str = "") -> List[Dict]:
    """Tables on stdout, bench_cuda.csv, lists.png and collectives.png under
    out_dir, summary.txt (the targets table); returns the target lines."""
    os.makedirs(out_dir, exist_ok=True)
    lists = [r for r in rows if r["part"] == "lists" and not r.get("error")]
    big = [r for r in lists if r["bytes"] >= MiB]
    if big:
        print_table(big, ["placement", "k", "dtype", "algorithm", "size", "fastpar_GBps", "baseline",
                          "baseline_GBps", "copy_GBps", "vs_baseline", "of_copy"],
                    "List allreduce from 1 MiB (GB/s = 2*k*size / time, CUDA events, median)")
    host = [r for r in rows if r["part"] == "host"]
    if host:
        print_table(host, ["call", "k", "host_us", "error"], "Host time per call, 4 KiB (N calls, one synchronize)")
    ipc = [r for r in rows if r["part"] == "ipc"]
    if ipc:
        print_table(ipc, ["backend", "placement", "ranks", "size", "us", "host_us", "algbw_GBps", "busbw_GBps",
                          "error"], "dist.all_reduce across processes")
    lines = targets(rows)
    print_table(lines, ["target", "goal", "measured", "status", "how"], "Targets (the issues') and measured")
    errs = errors(rows)
    for e in errs:
        print(f"error: {e}")
    write_csv(rows, os.path.join(out_dir, "bench_cuda.csv"))
    with open(os.path.join(out_dir, "summary.txt"), "w") as f:
        f.write(header)
        for t in lines:
            m = t["measured"]
            f.write(f"{t['target']:<70} {t['goal']:>7}  {m if isinstance(m, str) else f'{m:.3g}':>12}  "
                    f"{t['status']:<6}  {t['how']}\n")
        for e in errs:
            f.write(f"error: {e}\n")
    series: Dict[str, list] = {}
    for r in lists:
        if r["placement"] == ONE_GPU and r["dtype"] == "float32" and r["k"] in (2, 8):
            series.setdefault(f"{r['algorithm']} k={r['k']}", []).append((r["bytes"], r["fastpar_GBps"]))
            if r["algorithm"] == "direct":
                series.setdefault(f"torch stack+sum k={r['k']}", []).append((r["bytes"], r["baseline_GBps"]))
                series.setdefault(f"copy ceiling k={r['k']}", []).append((r["bytes"], r["copy_GBps"]))
    if series:
        plot_lines(series, os.path.join(out_dir, "lists.png"), "bytes per tensor", "GB/s (2*k*size / time)",
                   "fastpar.allreduce, k float32 tensors on one GPU")
    series = {}
    for r in ipc:
        if not r.get("error"):
            series.setdefault(f"{r['backend']} {r['ranks']} ranks, {r['placement']}", []).append(
                (r["bytes"], r["busbw_GBps"]))
    if series:
        plot_lines(series, os.path.join(out_dir, "collectives.png"), "bytes", "busbw GB/s",
                   "dist.all_reduce across processes")
    return lines
