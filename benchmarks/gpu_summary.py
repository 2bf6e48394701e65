"""The GPU benchmark's rows, its targets and its one summary table: pure
Python (no CUDA), so the table, CSV and plots are tested on any machine
(tests/tooling/test_bench_cuda.py) and bench_cuda.py only measures.

Row kinds (the "part" column):
  lists  fastpar.allreduce over k tensors in one process, beside a baseline
         (torch.stack(ts).sum(0) + copies on one GPU, torch.cuda.nccl.all_reduce
         on distinct GPUs) and the copy ceiling (one device-to-device copy of
         the same bytes); GB/s count k inputs read + k outputs written
  host   host time per call at 4 KiB: N calls, then one synchronize
  ipc    dist.all_reduce across processes (fastpar or NCCL group); algbw =
         bytes / time, busbw = algbw * 2(n-1)/n (nccl-tests' convention)
  ref    the units the GPU targets are stated in, measured in the process
         (and run) whose rows they judge: "launch_us", the host time of one
         kernel launch from Python (x.add_(y), 4 KiB), and "copy_GBps", what
         a device-to-device copy moves (read + write bytes per second). So a
         target holds on any host: "1.3 launches", "0.8 of a copy".
"""
from __future__ import annotations

import math
import os
import statistics
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


def ref_row(what: str, placement: str, ranks: int, value: Optional[float], error: str = "") -> Dict:
    return {"part": "ref", "what": what, "placement": placement, "ranks": ranks,
            "value": value if value else float("nan"), "error": error}


def _ok(values) -> List[float]:
    return [v for v in values if isinstance(v, (int, float)) and not math.isnan(v)]


def _target(name: str, target: str, values: List[float], better: str, bound: float) -> Dict:
    """One summary line: the worst measured value against the target."""
    vals = _ok(values)
    if not vals:
        return {"target": name, "goal": target, "measured": "not measured", "status": "-"}
    worst = max(vals) if better == "lower" else min(vals)
    met = worst <= bound if better == "lower" else worst >= bound
    status = "met" if met else "MISSED"
    if len(vals) < len(values):  # some rows of this target failed or were cut by a time limit
        status += f" ({len(vals)} of {len(values)} rows)"
    return {"target": name, "goal": target, "measured": worst, "status": status}


def schedule_ratios(rows: List[Dict]) -> Dict[str, List[float]]:
    """Each schedule against the one it replaces, in the same run: new time /
    old time per size, ranks and placement (< 1: the new one is faster), keyed
    by the choice it decides (decisions)."""
    ipc = [r for r in rows if r["part"] == "ipc" and not r.get("error")]
    us = {(r["backend"], r["placement"], r["ranks"], r["bytes"]): r["us"] for r in ipc}

    def versus(new: str, old: str, ranks=None, max_bytes=1 << 62) -> List[float]:
        return [t / us[(old, *where)] for (backend, *where), t in us.items()
                if backend == new and (old, *where) in us and (ranks is None or where[1] in ranks)
                and where[2] <= max_bytes]

    # The fused two-shot (one kernel a call; the plain rows) against the
    # step-by-step one (2mn + 1 stream operations), and the registered push
    # (one kernel, 2kN bytes) against the registered schedule step by step:
    # one knob picks both.
    two_shot = versus("fastpar", "fastpar two-shot steps") + versus("fastpar registered", "fastpar registered steps")
    # broadcast, all_gather and reduce_scatter as one kernel against step by
    # step (bench_cuda.py's "fastpar OP fused" and "fastpar OP steps" rows).
    collectives = []
    for backend in sorted({k[0] for k in us if k[0].endswith(" fused")}):
        collectives += versus(backend, backend[:-len("fused")] + "steps")
    # The one-kernel calls' block barriers: flags written into the waiter's
    # memory against the peer's flag polled, eager and graphed.
    flags = versus("fastpar flags waiter", "fastpar flags peer") + versus("fastpar graph flags waiter",
                                                                          "fastpar graph flags peer")
    return {"two_shot": two_shot, "collectives": collectives, "flags": flags}


# The knob of each choice (docs/knobs.md) and its two forms: the new one,
# then the measured fallback that is the default until a GPU run decides.
CHOICES = {"two_shot": ("FASTPAR_CUDA_IPC_TWO_SHOT", "fused", "steps"),
           "collectives": ("FASTPAR_CUDA_IPC_COLLECTIVES", "fused", "steps"),
           # the test hook's only (no environment variable)
           "flags": ("FASTPAR_CUDA_IPC_FLAGS", "waiter", "peer")}
# The new form wins when it is faster at the median of the sizes compared
# and at most this much slower at any one (the timing noise of one run).
ADOPT_WORST = 1.05


def decisions(rows: List[Dict]) -> List[str]:
    """What this run decides, one line a choice it compared: the form that
    won (schedule_ratios, ADOPT_WORST), so that the loser and its knob can
    go (the one-shot limit per rank count: one_shot_choice). A choice the
    run did not compare gets no line."""
    out = []
    for key, ratios in schedule_ratios(rows).items():
        ratios = _ok(ratios)
        if not ratios:
            continue
        knob, new, old = CHOICES[key]
        med, worst = statistics.median(ratios), max(ratios)
        won = new if med < 1 and worst <= ADOPT_WORST else old
        out.append(f"{knob}: {won} won ({new} / {old} time: median {med:.3g}, worst {worst:.3g}, "
                   f"{len(ratios)} sizes); the {old if won == new else new} form can go")
    return out


def targets(rows: List[Dict]) -> List[Dict]:
    """The targets, in kernel launches and fractions of a copy measured in the
    same run, beside what was measured: each line the worst row's ratio and
    its goal."""
    lists = [r for r in rows if r["part"] == "lists" and r["placement"] == ONE_GPU]
    host = {(r["call"], r["k"]): r["host_us"] for r in rows if r["part"] == "host"}
    ipc = [r for r in rows if r["part"] == "ipc"]
    ref = {(r["what"], r["placement"], r["ranks"]): r["value"] for r in rows if r["part"] == "ref"}
    nan = float("nan")

    def direct(min_b=0, max_b=1 << 62):
        return [r for r in lists if r["algorithm"] == "direct" and min_b <= r["bytes"] <= max_b]

    ring_vs_direct = []
    for r in lists:
        if r["algorithm"] == "ring" and r["bytes"] >= MiB:
            d = [x for x in direct(r["bytes"], r["bytes"]) if x["k"] == r["k"] and x["dtype"] == r["dtype"]]
            if d:
                ring_vs_direct.append(r["fastpar_GBps"] / d[0]["fastpar_GBps"])
    one = "shared cuda:0"

    def fastpar_on_one(ranks, backend="fastpar"):
        return {r["bytes"]: r for r in ipc if r["backend"] == backend and r["placement"] == one and r["ranks"] == ranks}

    two, two_graph, two_reg = fastpar_on_one(2), fastpar_on_one(2, "fastpar graph"), fastpar_on_one(2, "fastpar registered")
    launch_lists = host.get(("torch add_ (one launch)", 1), nan)
    launch_two = ref.get(("launch_us", one, 2), nan)
    copy_two = ref.get(("copy_GBps", one, 2), nan)  # read + write GB/s

    def of_ceiling(row, traffic_per_byte):
        """The physical ceiling's time (traffic_per_byte x N bytes of HBM traffic
        at the copy's rate) over the measured time."""
        return traffic_per_byte * row["bytes"] / (copy_two * 1e9) / (row["us"] * 1e-6)

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
    # The design risks one GPU run decides (bench_cuda.py rows): (a) the busy
    # rank's compute time while its peer's fused two-shot spins, against the
    # steps form's; (b) 2 MiB slots against the default 8 MiB.
    def ratio(new, old):
        a_, b_ = fastpar_on_one(2, new), fastpar_on_one(2, old)
        return [a_[k]["us"] / b_[k]["us"] for k in sorted(a_) if k in b_ and a_[k].get("us") and b_[k].get("us")]
    busy = ratio("busy rank compute, two-shot fused", "busy rank compute, two-shot steps")
    slots = ratio("fastpar slot 8 MiB", "fastpar slot 2 MiB")
    def of_ceiling_k(ranks):
        """k ranks' plain all_reduce from 8 MiB against its traffic floor,
        (5k - 2) N bytes of HBM traffic (copy-in, publish, reduce, copy-out),
        at the rate of a copy measured in the same k-rank run."""
        rate = ref.get(("copy_GBps", one, ranks), nan)
        return [(5 * ranks - 2) * r["bytes"] / (rate * 1e9) / (r["us"] * 1e-6)
                for b, r in fastpar_on_one(ranks).items() if b >= 8 * MiB]

    def at_1mib_vs_two(ranks):
        rows_n = fastpar_on_one(ranks)
        return [rows_n[MiB]["us"] / two[MiB]["us"]] if MiB in rows_n and MiB in two else []

    def host_4k(rows_by_size):
        r = rows_by_size.get(4 * KiB)
        return [r["host_us"] / launch_two] if r else []

    # torch's own cost per dist.all_reduce (its Python wrapper, dispatcher and
    # Work): the same call on its "fake" backend, which does nothing.
    fake = fastpar_on_one(2, "torch fake backend")
    over_fake = ([(two[4 * KiB]["host_us"] - fake[4 * KiB]["host_us"]) / launch_two]
                 if 4 * KiB in two and 4 * KiB in fake else [])
    new_vs_old = schedule_ratios(rows)

    return [
        # one kernel per call: the physical ceilings
        _target("2, 3, 4 ranks on one GPU, plain, from 8 MiB, of the (5k-2)N ceiling at the copy's rate (worst)",
                ">= 0.85", of_ceiling_k(2) + of_ceiling_k(3) + of_ceiling_k(4), "higher", 0.85),
        _target("registered, 2 ranks on one GPU, from 8 MiB, of the 2kN ceiling (4N) (worst)", ">= 0.8",
                [of_ceiling(r, 4) for b, r in two_reg.items() if b >= 8 * MiB], "higher", 0.8),
        _target("3 ranks on one GPU at 1 MiB, time / 2 ranks'", "<= 1.5", at_1mib_vs_two(3), "lower", 1.5),
        _target("4 ranks on one GPU at 1 MiB, time / 2 ranks'", "<= 1.5", at_1mib_vs_two(4), "lower", 1.5),
        # the host's share of a small call
        _target("direct call 4 KiB, 2 ranks on one GPU, host per call, in launches", "<= 1.05",
                host_4k(fastpar_on_one(2, "fastpar direct")), "lower", 1.05),
        _target("dist.all_reduce 4 KiB minus torch's fake backend's, 2 ranks, host per call, in launches", "<= 1.1",
                over_fake, "lower", 1.1),
        _target("graph replay 4 KiB, 2 ranks on one GPU, host per replay, in launches", "<= 0.6",
                host_4k(two_graph), "lower", 0.6),
        _target("list allreduce 4 KiB, k=2, host per call, in launches", "<= 1.2",
                [host.get(("direct", 2), nan) / launch_lists], "lower", 1.2),
        _target("list allreduce 4 KiB, k=8, host per call, in launches", "<= 1.4",
                [host.get(("direct", 8), nan) / launch_lists], "lower", 1.4),
        # the list ops' bandwidth
        _target("list direct at 1 MiB, k=2..8, of a copy (worst)", ">= 0.85",
                [r["of_copy"] for r in direct(MiB, MiB)], "higher", 0.85),
        _target("list ring / direct GB/s from 1 MiB, one GPU (worst)", ">= 0.8", ring_vs_direct, "higher", 0.8),
        _target("list direct / copy from 16 MiB (worst)", ">= 0.9", [r["of_copy"] for r in direct(16 * MiB)],
                "higher", 0.9),
        # each new schedule against the old one it replaces, in the same run
        _target("fused two-shot and registered push / step by step time, same run (worst)", "<= 1",
                new_vs_old["two_shot"], "lower", 1),
        _target("fused / step-by-step time of broadcast, all_gather, reduce_scatter from 1 MiB, same run (worst)",
                "<= 1", new_vs_old["collectives"], "lower", 1),
        _target("registered / plain all_reduce time from 1 MiB (worst)", "<= 1", registered_vs_plain, "lower", 1),
        _target("busy rank's compute time, peer in the fused / the steps two-shot, 2 ranks on one GPU", "<= 1.05",
                busy, "lower", 1.05),
        _target("8 MiB / 2 MiB slots, all_reduce time at 8-128 MiB, 2 ranks on one GPU (worst)", "<= 1", slots,
                "lower", 1),
        _target("2 ranks on one GPU, 1 MiB time / 256 KiB time", "<= 1.5",
                [two[MiB]["us"] / two[256 * KiB]["us"]] if MiB in two and 256 * KiB in two else [], "lower", 1.5),
        # several GPUs
        _target("distinct GPUs, 256 KiB dist.all_reduce us", "<= 10",
                [r["us"] for r in distinct if r["backend"] == "fastpar" and r["bytes"] == 256 * KiB], "lower", 10),
        _target("distinct GPUs, busbw / NCCL from 64 MiB (worst)", ">= 0.9", vs_nccl, "higher", 0.9),
    ]


def one_shot_limits(rows: List[Dict]) -> Dict[int, tuple]:
    """One-shot against two-shot all_reduce time, per rank count, on one
    shared GPU, from the same run: the plain rows ran one-shot up to the limit
    in force (the "one_shot_max_bytes" ref row) and two-shot above it; the
    forced rows ran the other schedule. Per rank count: (the limit in force,
    [(size, one-shot us, two-shot us)], the largest size up to which one-shot
    was never slower, from the smallest size both ran, or None): the last is
    what FASTPAR_CUDA_IPC_ONE_SHOT_MAX_BYTES should be on this GPU."""
    one = "shared cuda:0"
    ipc = [r for r in rows if r["part"] == "ipc" and r["placement"] == one and not r.get("error")]
    in_force = {r["ranks"]: r["value"] for r in rows
                if r["part"] == "ref" and r["what"] == "one_shot_max_bytes" and r["placement"] == one}
    out = {}
    for n, hi in sorted(in_force.items()):
        us = {(r["backend"], r["bytes"]): r["us"] for r in ipc if r["ranks"] == n}
        pairs = []
        for (backend, size), t in sorted(us.items(), key=lambda kv: kv[0][1]):
            if backend != "fastpar":
                continue
            if size <= hi:
                two = us.get(("fastpar two-shot forced", size), us.get(("fastpar two-shot above 256 KiB", size)))
                if two is not None:
                    pairs.append((size, t, two))
            elif ("fastpar one-shot forced", size) in us:
                pairs.append((size, us[("fastpar one-shot forced", size)], t))
        limit = None
        for size, t_one, t_two in pairs:
            if t_one > t_two:
                break
            limit = size
        out[n] = (hi, pairs, limit)
    return out


def one_shot_choice(rows: List[Dict]) -> List[Dict]:
    """one_shot_limits as table rows: one per rank count and size."""
    out = []
    for n, (hi, pairs, limit) in one_shot_limits(rows).items():
        for size, t_one, t_two in pairs:
            out.append({"ranks": n, "size": human_bytes(size), "one_shot_us": t_one, "two_shot_us": t_two,
                        "one/two": t_one / t_two, "limit in force": human_bytes(int(hi)),
                        "limit measured": human_bytes(limit) if limit else "below the sizes run"})
    return out


def errors(rows: List[Dict]) -> List[str]:
    return sorted({f"{r['part']}: {r['error']}" for r in rows if r.get("error")})


def report(rows: List[Dict], out_dir: str, header: str = "") -> List[Dict]:
    """Tables on stdout, bench_cuda.csv, lists.png and collectives.png under
    out_dir, and summary.txt (the targets table and what the run decided:
    decisions); returns the target lines."""
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
    ref = [r for r in rows if r["part"] == "ref"]
    if ref:
        print_table(ref, ["what", "placement", "ranks", "value", "error"],
                    "Units of the targets, measured in the same processes (one launch: us; a copy: GB/s read+write)")
    ipc = [r for r in rows if r["part"] == "ipc"]
    if ipc:
        print_table(ipc, ["backend", "placement", "ranks", "size", "us", "host_us", "algbw_GBps", "busbw_GBps",
                          "error"], "dist.all_reduce across processes")
    choice = one_shot_choice(rows)
    if choice:
        print_table(choice, list(choice[0]), "all_reduce one-shot vs two-shot, one GPU, same run "
                    "(FASTPAR_CUDA_IPC_ONE_SHOT_MAX_BYTES)")
    lines = targets(rows)
    print_table(lines, ["target", "goal", "measured", "status"], "Targets and measured")
    errs = errors(rows)
    for e in errs:
        print(f"error: {e}")
    decided = decisions(rows)
    for line in decided:
        print(f"decided: {line}")
    write_csv(rows, os.path.join(out_dir, "bench_cuda.csv"))
    with open(os.path.join(out_dir, "summary.txt"), "w") as f:
        f.write(header)
        for t in lines:
            m = t["measured"]
            f.write(f"{t['target']:<92} {t['goal']:>7}  {m if isinstance(m, str) else f'{m:.3g}':>12}  "
                    f"{t['status']}\n")
        for n in sorted({c["ranks"] for c in choice}):
            c = next(c for c in choice if c["ranks"] == n)
            f.write(f"one-shot limit, {n} ranks on one GPU: measured {c['limit measured']}, "
                    f"in force {c['limit in force']}\n")
        for line in decided:
            f.write(f"decided: {line}\n")
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
