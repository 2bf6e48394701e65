"""nccl-tests-style allreduce sweep: fastpar beside gloo (and NCCL when GPUs are
present) in the same run, on plain tensors through dist.all_reduce and on
fastpar registered buffers.

    python benchmarks/bench_distributed.py                 # 2 ranks, 4 B .. 256 MiB
    python benchmarks/bench_distributed.py --quick         # < 1 min
    python benchmarks/bench_distributed.py --ranks 4 --csv out.csv --plot out.png
    python benchmarks/bench_distributed.py --groups 12 --quick   # run-to-run spread
    python benchmarks/bench_distributed.py --groups 10 --sizes 1M,64M --no-gloo --csv g.csv --plot g.png
                                        # per group: fastpar beside Open MPI, placement measured
    python benchmarks/bench_distributed.py --dtype bfloat16 --quick

--groups G runs the sweep in G fresh process groups, one after another (new
processes, new shared-memory segments), each followed at once by Open MPI's
MPI_Allreduce on the same sizes (mpirun + mpi4py, when installed; --no-mpi
leaves it out), and reports min / median / max of each point over the groups
and each one's spread (max / min over the groups); per group, fastpar's time
over Open MPI's, the placement the group measured (shm_placement.h: the
form each size chose and its trials' times) beside the near and far forms
forced, what each group's ranks saw of the scheduler (CPUs they ran
on, migrations, involuntary context switches, page faults) and fastpar's time
over a local copy of the same tensor timed in the same group, so a slow group
can be told apart from a slow machine (docs/measurements.md, "The slow mode
of large messages"); the targets (fastpar <= 0.8x Open MPI in every group at
1 and 64 MiB; its spread <= Open MPI's + 0.2), a CSV per point and per group,
and a plot per size.

Every size also times all ranks copying a tensor of that size at once (the
copy rate of the cores the ranks run on, interleaved with the allreduce runs)
and prints each fastpar time as a fraction of its schedule's traffic floor at
that rate ("ceil"; the floors in docs/algorithms.md, "The traffic floor of a
CPU allreduce"). Each size's placement (shm_placement.h) is decided before it
is timed, as in a job's steady state; the CSV keeps the calls that took.

time is per call (the slowest rank's mean), algbw = bytes / time,
busbw = algbw * 2(n-1)/n (the bytes each rank's link must carry in any
allreduce, so numbers compare across rank counts). Ratios are fastpar / gloo
busbw and registered / plain fastpar.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

from launch import add_rank_options, run_or_launch, run_ranks
from mpi_baseline import mpi_sweep


def human(b: int) -> str:
    for unit, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s:
            return f"{b // s}{unit}" if b % s == 0 else f"{b / s:.1f}{unit}"
    return f"{b}B"


def parse_bytes(text: str) -> int:
    """'4096', '64K', '16M', '1G' -> bytes."""
    t = text.strip().upper().rstrip("IB").rstrip("B") if text.strip()[-1:].isalpha() else text.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


def sizes(lo: int, hi: int, quick: bool, listed: str | None = None) -> list[int]:
    if listed:
        return [parse_bytes(x) for x in listed.split(",") if x.strip()]
    if quick:
        return [s for s in (4, 4096, 65536, 1 << 20, 16 << 20) if lo <= s <= hi]
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 4
    return out


# ------------------------------------------------------------------ traffic floor

def _knob_bytes(name: str, default: int) -> int:
    v = os.environ.get(name, "").strip()
    return int(v) if v and int(v) >= 0 else default


def schedule_of(kind: str, nbytes: int, n: int, form: str = "near") -> str:
    """The shared-memory schedule fastpar's `kind` runs for an allreduce of
    `nbytes` on `n` ranks of one host in placement `form` (a registered
    buffer's far form is the copying two-shot), by the rules and knobs of
    docs/knobs.md: "one_shot", "two_shot" or "registered"."""
    slot = _knob_bytes("FASTPAR_SHM_SLOT_BYTES", 1 << 20)
    one_shot_max = _knob_bytes("FASTPAR_SHM_ONESHOT_MAX_BYTES", 256 << 10 if n <= 2 else 32 << 10)
    if kind == "fastpar_one_shot":
        return "one_shot" if nbytes <= slot else "two_shot"
    if kind == "fastpar_two_shot":
        return "two_shot"
    if kind == "fastpar_registered" and nbytes >= _knob_bytes("FASTPAR_SHM_REGISTERED_MIN_BYTES", 16 << 20):
        return "two_shot" if form == "far" else "registered"
    return "one_shot" if nbytes <= min(one_shot_max, slot) else "two_shot"


def traffic_per_rank(schedule: str, n: int, nbytes: int) -> float:
    """Bytes one rank reads plus writes in one allreduce of `nbytes` (the
    tables of docs/algorithms.md): the floor of the call's memory traffic."""
    return {"one_shot": (n + 3) * nbytes, "two_shot": (5 * n - 2) / n * nbytes,
            "registered": (3 * n - 1) / n * nbytes}[schedule]


def floor_seconds(kind: str, nbytes: int, n: int, copy_s: float, form: str = "near") -> float:
    """The time `kind`'s schedule (in placement `form`) needs at the copy rate
    of the ranks' cores: a copy of nbytes moves 2 * nbytes (read and write)
    in copy_s, measured with every rank copying at once."""
    return traffic_per_rank(schedule_of(kind, nbytes, n, form), n, nbytes) * copy_s / (2 * nbytes)


FASTPAR_KINDS = ("fastpar", "fastpar_registered", "fastpar_one_shot", "fastpar_two_shot", "fastpar_near",
                 "fastpar_far")


# ------------------------------------------------------------------ worker


def sched_stats() -> dict:
    """This process's view of the scheduler: the CPU it is on, migrations
    between CPUs, involuntary context switches, minor page faults."""
    import resource

    out = {"cpu": -1, "migrations": -1, "nonvol_switches": -1,
           "minor_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt}
    try:
        with open("/proc/self/stat") as f:
            out["cpu"] = int(f.read().rsplit(")", 1)[1].split()[36])  # field 39: processor
        with open("/proc/self/sched") as f:
            for line in f:
                if line.startswith("se.nr_migrations"):
                    out["migrations"] = int(line.split(":")[1])
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("nonvoluntary_ctxt_switches"):
                    out["nonvol_switches"] = int(line.split(":")[1])
    except (OSError, ValueError, IndexError):
        pass
    return out


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    import fastpar  # noqa: F401
    from fastpar._C import _testing
    import fastpar.distributed as fd

    rank, n = args.rank, args.ranks
    store = dist.TCPStore("127.0.0.1", args.port, n, rank == 0, timeout=datetime.timedelta(seconds=120),
                          wait_for_workers=False)
    dist.init_process_group("fastpar", store=store, rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=300))
    gloo = dist.new_group(backend="gloo")
    nccl = None
    if torch.cuda.is_available() and torch.cuda.device_count() >= n and not args.no_nccl:
        torch.cuda.set_device(rank)
        nccl = dist.new_group(backend="nccl")
    budget = 0.05 if args.quick else 0.25  # seconds of timed calls per point

    def measure_once(fn, group) -> float:
        """Mean seconds per call on the slowest rank; iteration count agreed via gloo."""
        fn()
        fn()  # warm: page faults, caches
        dist.barrier(group=gloo)
        t0 = time.perf_counter()
        fn()
        probe = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(probe, op=dist.ReduceOp.MAX, group=gloo)
        iters = int(max(3, min(args.max_iters, budget / max(probe.item(), 1e-7))))
        dist.barrier(group=gloo)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        if group is nccl and nccl is not None:
            torch.cuda.synchronize()
        dt = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=gloo)
        return dt.item()

    be = fd.get_fastpar_backend()

    def placement_classes(nb: int, registered: bool = False) -> list:
        """The placement classes an allreduce of nb bytes has used, most used
        first: a registered buffer's where it takes the registered schedule's
        class (`registered`), else those of the copying schedules."""
        registered = registered and schedule_of("fastpar_registered", nb, n) == "registered"
        return sorted((k for k in fd.placement()["classes"]
                       if k["registered"] == registered and k["min_bytes"] <= nb < 2 * k["min_bytes"]),
                      key=lambda k: -k["calls"])

    def settle_placement(fn, nb: int, mode: str, registered: bool = False) -> int:
        """Calls fn until nb's placement classes are decided (at most 200);
        the calls it took (0 when forced). The class state is agreed, so every
        rank stops at the same call."""
        if mode != "auto":
            return 0
        for i in range(200):
            ks = placement_classes(nb, registered)
            if ks and all(k["schedule"] != "measuring" for k in ks):
                return i
            fn()
        return 200

    before = sched_stats()
    cpus = set()
    default_one_shot = int(os.environ.get("FASTPAR_SHM_ONESHOT_MAX_BYTES", -1))
    default_placement = os.environ.get("FASTPAR_SHM_PLACEMENT", "") or "auto"
    rows = []
    dtype = getattr(torch, args.dtype)
    for nbytes in sizes(args.min_bytes, args.max_bytes, args.quick, args.sizes):
        count = max(1, nbytes // dtype.itemsize)
        plain = torch.ones(count, dtype=dtype)
        reg = fd.registered_empty((count,), dtype)
        reg.fill_(1.0)
        # (name, call, group, schedule): schedule forces fastpar's allreduce
        # algorithm for that entry (0 = auto), to place the auto threshold, or
        # its placement ("near" / "far").
        def fastpar_plain():
            dist.all_reduce(plain)

        kinds = [("fastpar", fastpar_plain, None, 0),
                 ("fastpar_registered", lambda: dist.all_reduce(reg), None, 0)]
        if not args.no_gloo:
            kinds.insert(0, ("gloo", lambda: dist.all_reduce(plain, group=gloo), gloo, 0))
        # Every rank copies its own tensor at once, interleaved with the
        # others: the copy rate of the cores the ranks run on, in this run's
        # minutes, from which each size's traffic floor follows (floor_seconds).
        scratch = torch.empty_like(plain)
        kinds.append(("local_copy", lambda: scratch.copy_(plain), None, 0))
        if args.schedules:
            kinds += [("fastpar_one_shot", fastpar_plain, None, 1), ("fastpar_two_shot", fastpar_plain, None, 2)]
        if args.placements or args.json:
            # The two-shot family's near and far schedules forced (shm_placement.h),
            # beside "fastpar", which runs what the group measured.
            kinds += [("fastpar_near", fastpar_plain, None, "near"), ("fastpar_far", fastpar_plain, None, "far")]
        if nccl is not None:
            g = torch.ones(count, dtype=torch.float32, device=f"cuda:{rank}")
            kinds.append(("nccl", lambda: dist.all_reduce(g, group=nccl), nccl, 0))
        # Repeats are interleaved (every kind once, then again): a noisy
        # neighbour then slows all kinds alike instead of one of them.
        row = {"bytes": count * dtype.itemsize}
        # A job's steady state: the size's placement decided before timing
        # (shm_placement.h; its trials run both forms), the calls it took kept.
        row["decided_after_calls"] = settle_placement(fastpar_plain, row["bytes"], default_placement)
        settle_placement(lambda: dist.all_reduce(reg), row["bytes"], default_placement, registered=True)
        for _ in range(args.repeats):
            for name, fn, group, algo in kinds:
                if isinstance(algo, str):
                    _testing.set_shm_placement(be, algo)
                elif algo:
                    _testing.set_shm_allreduce(be, 1 << 62, algo)
                t = measure_once(fn, group)
                if isinstance(algo, str):
                    _testing.set_shm_placement(be, default_placement)  # auto resumes the classes it measured
                elif algo:
                    _testing.set_shm_allreduce(be, default_one_shot, 0)
                if name == "fastpar":  # the form this size's class chose, and its trials' times
                    nb = count * dtype.itemsize
                    k = (placement_classes(nb) or [{"schedule": "-", "near_us": 0.0, "far_us": 0.0}])[0]
                    row["placement"], row["trial_near_us"], row["trial_far_us"] = k["schedule"], k["near_us"], k["far_us"]
                if name == "fastpar_registered":  # its floor depends on the form (schedule_of)
                    k = (placement_classes(count * dtype.itemsize, True) or [{"schedule": "-"}])[0]
                    row["registered_placement"] = k["schedule"] if default_placement == "auto" else default_placement
                row[name] = min(row.get(name, float("inf")), t)
                cpus.add(sched_stats()["cpu"])
        del reg
        rows.append(row)
        if rank == 0:
            print(f"  measured {human(row['bytes'])}", file=sys.stderr, flush=True)
    after = sched_stats()
    mine = {k: after[k] - before[k] for k in ("migrations", "nonvol_switches", "minor_faults")}
    mine["cpus"] = sorted(cpus)
    seen = [None] * n
    dist.all_gather_object(seen, mine, group=gloo)
    if rank == 0:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"rows": rows, "ranks": seen}, f)
        else:
            report(rows, n, args)
    dist.destroy_process_group()


# ------------------------------------------------------------------ report


def write_csv(path: str, records: list) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(records[0]))
        w.writeheader()
        w.writerows(records)
    print(f"wrote {path}")


def report(rows, n: int, args) -> None:
    kinds = [k for k in ("gloo", "fastpar", "fastpar_registered", "fastpar_one_shot", "fastpar_two_shot",
                         "fastpar_near", "fastpar_far", "local_copy", "nccl") if k in rows[0]]
    factor = 2 * (n - 1) / n
    ceil_kinds = [k for k in kinds if k in FASTPAR_KINDS]
    head = f"{'size':>9} " + " ".join(f"{k + ' us':>20} {'busbw GB/s':>10}" for k in kinds)
    head += (f" {'fastpar/gloo':>12}" if "gloo" in kinds else "") + f" {'reg/plain':>9}"
    head += f" {'copy GB/s':>9} " + " ".join(f"{k + ' ceil':>{max(9, len(k) + 5)}}" for k in ceil_kinds)
    print(f"\nallreduce {args.dtype} SUM, {n} ranks, {os.cpu_count()} CPUs; time = slowest rank's mean per call, "
          f"best of {args.repeats}")
    print(head)
    out = []
    for r in rows:
        rec = {"bytes": r["bytes"], "ranks": n, "placement_decided_after_calls": r.get("decided_after_calls", 0)}
        line = f"{human(r['bytes']):>9} "
        for k in kinds:
            t = r[k]
            alg = r["bytes"] / t / 1e9
            bus = alg * factor
            rec[f"{k}_us"], rec[f"{k}_algbw"], rec[f"{k}_busbw"] = t * 1e6, alg, bus
            line += f"{t * 1e6:>20.2f} {bus:>10.3f} "
        if "gloo" in kinds:
            rec["fastpar_over_gloo"] = r["gloo"] / r["fastpar"]
            line += f"{rec['fastpar_over_gloo']:>12.2f} "
        rec["registered_over_plain"] = r["fastpar"] / r["fastpar_registered"]
        line += f"{rec['registered_over_plain']:>9.2f}"
        # The copy rate of the ranks' cores (bytes read + written per second,
        # every rank copying at once) and each fastpar time as a fraction of
        # its schedule's traffic floor at that rate (1.0: the floor).
        rec["copy_GBps"] = 2 * r["bytes"] / r["local_copy"] / 1e9
        line += f" {rec['copy_GBps']:>9.2f} "
        for k in ceil_kinds:
            form = r.get("registered_placement", "near") if k == "fastpar_registered" else "near"
            rec[f"{k}_schedule"] = schedule_of(k, r["bytes"], n, form)
            rec[f"{k}_floor_us"] = floor_seconds(k, r["bytes"], n, r["local_copy"], form) * 1e6
            rec[f"{k}_of_ceiling"] = rec[f"{k}_floor_us"] / rec[f"{k}_us"]
            line += f"{rec[f'{k}_of_ceiling']:>{max(9, len(k) + 5)}.2f} "
        print(line)
        out.append(rec)
    print(f"copy GB/s: bytes read + written per second by each rank copying a tensor of the size, all ranks at "
          f"once, measured between the allreduce runs. ceil: the schedule's traffic floor at that rate "
          f"(bytes per rank, docs/algorithms.md: one-shot (n+3)B, two-shot (5n-2)/n B, registered "
          f"(3n-1)/n B) over the measured time; 1.0 = as fast as copying the same bytes.")
    if args.csv:
        write_csv(args.csv, out)
    if args.plot:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib is not importable: skipping the plot (pip install matplotlib)")
            return
        fig, ax = plt.subplots(figsize=(8, 5))
        xs = [r["bytes"] for r in out]
        for k in kinds:
            if k != "local_copy":
                ax.plot(xs, [r[f"{k}_busbw"] for r in out], marker="o", label=k)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"allreduce {args.dtype}, {n} CPU ranks")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.savefig(args.plot, dpi=120, bbox_inches="tight")
        print(f"wrote {args.plot}")


GROUP_KINDS = ("gloo", "fastpar", "fastpar_near", "fastpar_far", "fastpar_registered", "mpi", "nccl")


def report_groups(groups: list, n: int, args) -> None:
    """min / median / max over fresh groups of each point's time; per group,
    fastpar against Open MPI measured right after it, the placement the group
    measured and the schedule it ran, and the ranks' scheduler figures."""
    for g in groups:  # Open MPI's times into the rows, as one more kind
        for r in g["rows"]:
            if g.get("mpi"):
                r["mpi"] = g["mpi"][r["bytes"]]
    kinds = [k for k in GROUP_KINDS if all(k in g["rows"][0] for g in groups)]
    print(f"\nallreduce {args.dtype} SUM, {n} ranks, {len(groups)} fresh groups: us per call "
          f"(slowest rank's mean, best of {args.repeats} in each group), min / median / max over groups")
    print(f"{'size':>9} " + " ".join(f"{k:>30}" for k in kinds) + f" {'fastpar max/min':>16}")
    out = []
    for i, r0 in enumerate(groups[0]["rows"]):
        line = f"{human(r0['bytes']):>9} "
        rec = {"bytes": r0["bytes"], "ranks": n, "groups": len(groups)}
        for k in kinds:
            ts = sorted(g["rows"][i][k] * 1e6 for g in groups)
            lo, med, hi = ts[0], statistics.median(ts), ts[-1]
            rec.update({f"{k}_min_us": lo, f"{k}_median_us": med, f"{k}_max_us": hi, f"{k}_max_over_min": hi / lo})
            line += f"{lo:>9.1f} / {med:>8.1f} / {hi:>8.1f} "
        line += f"{rec['fastpar_max_over_min']:>16.2f}"
        print(line)
        out.append(rec)
    print("\nper group: fastpar's time over Open MPI's [the form its size class chose: its trials' best near / far "
          "us, the slowest rank's], and over a local copy of the same tensor "
          "(every rank at once, measured between the allreduce runs: "
          "a group whose allreduce slows while its copy does not has a slow path between its cores), "
          "and its schedule's traffic floor at that copy rate over its time (docs/algorithms.md)")
    per_group = []
    for g_i, g in enumerate(groups):
        cells = []
        for r in g["rows"]:
            rec = {"group": g_i, "bytes": r["bytes"], "placement": r.get("placement", "-"),
                   "trial_near_us": r.get("trial_near_us", 0), "trial_far_us": r.get("trial_far_us", 0),
                   "fastpar_over_copy": r["fastpar"] / r["local_copy"],
                   "copy_GBps": 2 * r["bytes"] / r["local_copy"] / 1e9,
                   "fastpar_of_ceiling": floor_seconds("fastpar", r["bytes"], n, r["local_copy"]) / r["fastpar"]}
            for k in kinds:
                rec[f"{k}_us"] = r[k] * 1e6
            if "mpi" in kinds:
                rec["fastpar_over_mpi"] = r["fastpar"] / r["mpi"]
            per_group.append(rec)
            ratio = f" {rec['fastpar_over_mpi']:.2f}x MPI" if "mpi" in kinds else ""
            cells.append(f"{human(r['bytes'])} {r['fastpar'] * 1e6:.0f} us{ratio} {rec['fastpar_over_copy']:.2f}x copy "
                         f"{rec['fastpar_of_ceiling']:.2f} of ceiling "
                         f"[{rec['placement']} {rec['trial_near_us']:.0f}/{rec['trial_far_us']:.0f}]")
        print(f"  group {g_i:>2}: " + "; ".join(cells))
        print("            " + "  ".join(f"r{r}: cpus {s['cpus']} mig {s['migrations']} invol {s['nonvol_switches']} "
                                       f"flt {s['minor_faults']}" for r, s in enumerate(g["ranks"])))
    targets(out, per_group, kinds)
    if args.csv:
        write_csv(args.csv, out)
        base, ext = os.path.splitext(args.csv)
        write_csv(f"{base}_per_group{ext or '.csv'}", per_group)
    if args.plot:
        plot_groups(per_group, kinds, n, args)


def targets(out: list, per_group: list, kinds: list) -> None:
    """The per-group targets: fastpar at most 0.8x Open MPI's time at 1 and
    64 MiB in every group, and fastpar's spread over the groups at most Open
    MPI's plus 0.2."""
    if "mpi" not in kinds:
        print("Open MPI: not measured (needs mpirun and mpi4py; --no-mpi skips it)")
        return
    for b in (1 << 20, 64 << 20):
        ratios = [r["fastpar_over_mpi"] for r in per_group if r["bytes"] == b]
        if not ratios:
            continue
        worst = max(ratios)
        print(f"{human(b)}: fastpar / Open MPI per group {min(ratios):.2f}-{worst:.2f} "
              f"({'met' if worst <= 0.8 else 'missed'}: target <= 0.8 in every group)")
    for rec in out:
        if rec["bytes"] in (1 << 20, 64 << 20):
            f, m = rec["fastpar_max_over_min"], rec["mpi_max_over_min"]
            print(f"{human(rec['bytes'])}: spread (max / min over groups) fastpar {f:.2f}, Open MPI {m:.2f} "
                  f"({'met' if f <= m + 0.2 else 'missed'}: target fastpar <= Open MPI + 0.2)")


def plot_groups(per_group: list, kinds: list, n: int, args) -> None:
    """One panel per size: each kind's time in each group (a group's slow
    mode shows as a column that rises for some kinds and not others)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not importable: skipping the plot (pip install matplotlib)")
        return
    sizes_ = sorted({r["bytes"] for r in per_group})
    fig, axes = plt.subplots(1, len(sizes_), figsize=(5 * len(sizes_), 4.5), squeeze=False)
    for ax, b in zip(axes[0], sizes_):
        rows = [r for r in per_group if r["bytes"] == b]
        for k in kinds:
            ax.plot([r["group"] for r in rows], [r[f"{k}_us"] for r in rows], marker="o", label=k)
        ax.set_yscale("log")
        ax.set_xticks([r["group"] for r in rows])
        ax.set_xlabel("fresh group")
        ax.set_ylabel("us per call")
        ax.set_title(f"{human(b)}, {n} ranks")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"allreduce {args.dtype}: fastpar (measured placement, near, far) beside Open MPI per fresh group",
                 y=1.02)
    fig.savefig(args.plot, dpi=110, bbox_inches="tight")
    print(f"wrote {args.plot}")


# ------------------------------------------------------------------ launcher


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_rank_options(p)
    p.add_argument("--min-bytes", type=int, default=4)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--max-iters", type=int, default=20000)
    p.add_argument("--quick", action="store_true", help="5 sizes, short timing: under a minute")
    p.add_argument("--csv", default=None, help="write results to this CSV file")
    p.add_argument("--plot", default=None, help="write a busbw plot (PNG) to this file")
    p.add_argument("--no-nccl", action="store_true")
    p.add_argument("--no-gloo", action="store_true", help="leave gloo out (it dominates the run time at large sizes)")
    p.add_argument("--sizes", default=None, help="comma-separated sizes instead of the sweep, e.g. 1M,16M,64M")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--repeats", type=int, default=None,
                   help="measure each point this many times and keep the best (default 3, 1 with --quick): "
                        "on a shared machine the best run is the reproducible one")
    p.add_argument("--schedules", action="store_true",
                   help="also time fastpar's one-shot and two-shot schedules forced (one-shot only up to "
                        "FASTPAR_SHM_SLOT_BYTES)")
    p.add_argument("--placements", action="store_true",
                   help="also time fastpar's near and far schedules forced (FASTPAR_SHM_PLACEMENT); "
                        "--groups always does")
    p.add_argument("--no-mpi", action="store_true", help="--groups: leave Open MPI out")
    p.add_argument("--groups", type=int, default=1,
                   help="run the sweep in this many fresh process groups and report min / median / max")
    p.add_argument("--json", default=None, help=argparse.SUPPRESS)  # one group's raw results (set by --groups)
    args = p.parse_args()
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.groups > 1 and args.rank < 0:
        groups = []
        with tempfile.TemporaryDirectory() as tmp:
            for g in range(args.groups):
                path = os.path.join(tmp, f"group{g}.json")
                print(f"group {g + 1}/{args.groups}", file=sys.stderr, flush=True)
                run_ranks(__file__, sys.argv[1:] + ["--json", path], args.ranks)
                with open(path) as f:
                    groups.append(json.load(f))
                if not args.no_mpi:
                    # Open MPI on the same sizes, in the same minutes as this group
                    groups[-1]["mpi"] = mpi_sweep([r["bytes"] for r in groups[-1]["rows"]], args.ranks,
                                                  repeats=args.repeats, budget_s=0.05 if args.quick else 0.25,
                                                  max_iters=args.max_iters)
        report_groups(groups, args.ranks, args)
        return
    run_or_launch(p, args, worker, __file__)


if __name__ == "__main__":
    main()
