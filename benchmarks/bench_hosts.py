"""fastpar's hierarchical all_reduce against flat gloo across hosts made of
namespaces (tests/multihost/netns_hosts.py: one network namespace, /dev/shm,
pid, IPC and UTS namespace per host, links shaped by tc tbf). Needs root.

    sudo .venv/bin/python benchmarks/bench_hosts.py            # 1 and 10 Gbit/s, 2x2 2x3 3x2, 4 KiB-256 MiB
    sudo .venv/bin/python benchmarks/bench_hosts.py --quick    # 1 Gbit/s, 2x2 and 3x2, up to 16 MiB

For each link rate and layout (hosts x ranks per host) torchrun starts in
every host; each rank times, per size, (1) fastpar's all_reduce over every
rank (shared memory inside each host, gloo between the hosts' leaders),
(2) gloo's all_reduce over every rank, and the two levels of fastpar's
schedule alone: (3) "intra": reduce to the host's leader then broadcast from
it, over one host's ranks (fastpar, shared memory; every host at once), and
(4) "inter": gloo's all_reduce among the leaders, and, where every host has
the same number (2 or more) of ranks, (1b) "fastpar_sharded": fastpar's
all_reduce under FASTPAR_HOSTS_ALLREDUCE=sharded (every rank of a host
carries one share between hosts; column "lead/shard": the default leaders'
schedule's time over it). Then, in the same hosts,
(5) Open MPI's MPI_Allreduce over as many ranks (mpirun started outside the
hosts, ranks in them: mpi_baseline.mpi_sweep_hosts), when mpirun and mpi4py
are installed; otherwise the output says which is missing. Its result is
checked (every element on every rank) before it is reported.

A time is the slowest rank's mean over a round's calls, the median of
--rounds rounds (default 3) that take turns between the implementations, so
that a disturbance (another program on the cores) lands in one round of each
and is left out. While each layout's torchrun ranks run (before Open MPI's),
the cores that other work keeps busy are measured (/proc/stat less the ranks'
own CPU time) and written with its rows ("others_cores"). The "link fraction" is
the bytes every host must send and receive for an all_reduce of S bytes over
H hosts, 2 (H-1)/H S, over the time and the link rate: 1.0 means the links
were busy all the time with nothing but necessary bytes. "fp/mpi" is
fastpar's time over Open MPI's.

The cost model (hosts_model.py): alpha-beta per level, fitted on (3) and (4),
composed into the pipeline of pieces that hierarchical_engine.cpp runs with
two constants fitted on (1): a per-call cost and the CPU time per byte of the
leaders' TCP that the shared-memory steps wait for (the levels share the
cores). Its error on every point of (1) is printed in-sample, held out (the
two constants fitted without the layout) and with the levels only, and it is
extrapolated to 8 hosts x 8 ranks and 64 x 8.

Writes bench_hosts.csv, bench_hosts.png and bench_hosts_model.json into --out
(default: the current directory).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "multihost"))

import hosts_model  # noqa: E402  (beside this file)
import mpi_baseline  # noqa: E402
RATES = {"1gbit": 1e9, "10gbit": 10e9}
MIN_REPORTED = 1 << 20  # the model's errors are summed up for every size and from here


def sizes(max_bytes: int) -> list[int]:
    """4 KiB to max_bytes: x4 to 1 MiB, x2 to 16 MiB (where the pipeline's
    piece count changes), then x4."""
    out, s = [], 4096
    while s <= max_bytes:
        out.append(s)
        s *= 4 if s < (1 << 20) else 2 if s < (16 << 20) else 4
    return out


# ----------------------------------------------------------------------------- worker (one rank, under torchrun)
def worker(max_bytes: int, budget_s: float, rounds: int) -> None:
    import torch
    import torch.distributed as dist

    import fastpar  # noqa: F401  (registers "fastpar")
    from fastpar.distributed import backend as fd_backend

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("fastpar", timeout=datetime.timedelta(seconds=300))
    ids = [None] * world
    dist.all_gather_object(ids, fd_backend._host_id())
    order = list(dict.fromkeys(ids))
    host = [order.index(i) for i in ids]
    H = len(order)
    hosts = [[r for r in range(world) if host[r] == h] for h in range(H)]
    leaders = [rs[0] for rs in hosts]
    local_groups = [dist.new_group(rs, backend="fastpar") for rs in hosts]
    mine = local_groups[host[rank]]
    leaders_gloo = dist.new_group(leaders, backend="gloo")
    world_gloo = dist.new_group(list(range(world)), backend="gloo")
    sharded = None  # a world group under the sharded schedule, where it applies (fastpar's rule: _columns)
    if fd_backend._columns(host, rank, "sharded") is not None:
        os.environ["FASTPAR_HOSTS_ALLREDUCE"] = "sharded"  # read when the group's backend is created
        sharded = dist.new_group(list(range(world)), backend="fastpar")
        assert fd_backend.get_fastpar_backend(sharded).hosts_allreduce == "sharded"
        os.environ["FASTPAR_HOSTS_ALLREDUCE"] = "leaders"  # as run_layout set it for the default group
    ctl = torch.zeros(1)

    def agree_max(x: float) -> float:
        ctl.fill_(x)
        dist.all_reduce(ctl, op=dist.ReduceOp.MAX)
        return float(ctl.item())

    def calls_for(fn, active: bool) -> int:
        """How many calls fill one round's share of the budget (every rank the same)."""
        dist.barrier()
        t0 = time.perf_counter()
        if active:
            fn()
        first = agree_max(time.perf_counter() - t0 if active else 0.0)
        return int(max(1, min(200, budget_s / rounds / max(first, 1e-6))))

    def timed(fn, active: bool, n: int) -> float:
        """Slowest rank's mean seconds per call over n calls; ranks not `active` only wait."""
        dist.barrier()
        t0 = time.perf_counter()
        if active:
            for _ in range(n):
                fn()
        return agree_max((time.perf_counter() - t0) / n if active else 0.0)

    for nbytes in sizes(max_bytes):
        t = torch.ones(nbytes // 4)
        impls = {
            "fastpar": (lambda: dist.all_reduce(t), True),
            "gloo": (lambda: dist.all_reduce(t, group=world_gloo), True),
            "intra": (lambda: (dist.reduce(t, dst=hosts[host[rank]][0], group=mine),
                               dist.broadcast(t, src=hosts[host[rank]][0], group=mine)), True),
            "inter": (lambda: dist.all_reduce(t, group=leaders_gloo), rank in leaders),
        }
        if sharded is not None:
            impls["fastpar_sharded"] = (lambda: dist.all_reduce(t, group=sharded), True)
        calls = {impl: calls_for(fn, active) for impl, (fn, active) in impls.items()}
        # Rounds that take turns, each starting with the next implementation:
        # a disturbance (another program on the shared cores) lands in one
        # round of each, and the median leaves it out.
        times = {impl: [] for impl in impls}
        turn = list(impls)
        for k in range(rounds):
            for impl in turn[k % len(turn):] + turn[:k % len(turn)]:
                fn, active = impls[impl]
                times[impl].append(timed(fn, active, calls[impl]))
        rows = {impl: statistics.median(ts) for impl, ts in times.items()}
        if rank == 0:
            for impl, sec in rows.items():
                print("BENCH " + json.dumps({"bytes": nbytes, "impl": impl, "seconds": sec}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- driver
def busy_cpu_s() -> float:
    """CPU seconds this machine has been busy since boot, every core: /proc/stat's user, nice, system, irq,
    softirq and steal (guest time is already in user and nice)."""
    with open("/proc/stat") as f:
        user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds of this process and of its children that have been waited for (the hosts' ranks, through torchrun)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def run_layout(H: int, R: int, rate: str, max_bytes: int, budget_s: float, rounds: int,
               timeout: float) -> tuple[list[dict], float]:
    """The rows of one layout, and the cores that other work kept busy while its
    ranks ran, on average: busy CPU time that is not the ranks', the driver's or
    their children's, over the wall time. That is other programs, and the
    kernel's network work done outside the ranks (ksoftirqd); a run that other
    programs disturbed shows it here."""
    from netns_hosts import Hosts

    with Hosts(H, rate=rate) as hs:
        env = lambda h: hs.env({"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),  # noqa: E731
                                "FASTPAR_BIND_CORES": "0",
                                # the "fastpar" rows: the default schedule, whatever the caller's environment
                                "FASTPAR_HOSTS_ALLREDUCE": "leaders"})
        script = [os.path.abspath(__file__), "--worker", "--max-bytes", str(max_bytes), "--budget", str(budget_s),
                  "--rounds", str(rounds)]
        busy0, own0, wall0 = busy_cpu_s(), own_cpu_s(), time.monotonic()
        procs = [hs.popen(h, hs.torchrun_argv(h, R, script, run_id=f"bench{os.getpid()}"), env=env(h),
                          stderr=subprocess.STDOUT) for h in range(H)]
        deadline = time.monotonic() + timeout
        outs = []
        for h, p in enumerate(procs):
            try:
                out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hs.close()
                out, _ = p.communicate()
            outs.append(out)
            if p.returncode != 0:
                raise RuntimeError(f"{H}x{R} at {rate}: host {h}'s torchrun exited {p.returncode}:\n{out[-4000:]}")
        others = ((busy_cpu_s() - busy0) - (own_cpu_s() - own0)) / (time.monotonic() - wall0)
        mpi = mpi_baseline.mpi_sweep_hosts(hs, [R] * H, sizes(max_bytes), budget_s=budget_s) \
            if mpi_baseline.available() else None
    rows = [json.loads(line[6:]) for out in outs for line in out.splitlines() if line.startswith("BENCH ")]
    if mpi is not None:
        want = H * R * (H * R + 1) / 2  # rank r gives r + 1
        wrong = {b: v for b, v in mpi["sum"].items() if v != want}
        if wrong:
            raise RuntimeError(f"{H}x{R} at {rate}: Open MPI's all_reduce gave {wrong} (bytes: value), not {want}")
        rows += [{"bytes": b, "impl": "openmpi", "seconds": sec} for b, sec in mpi["seconds"].items()]
    for r in rows:
        r.update(layout=f"{H}x{R}", hosts=H, ranks_per_host=R, rate=rate, others_cores=others)
    return rows, others


def link_fraction(row: dict) -> float:
    H, S = row["hosts"], row["bytes"]
    must = 2 * (H - 1) / H * S
    return must * 8 / row["seconds"] / RATES[row["rate"]]


def fmt_bytes(n: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:g} {unit}"
    return f"{n} B"


def report(rows: list[dict], out_dir: str, fit_rows: list[dict] | None = None) -> None:
    """Table, model, plot and files of `rows`; the model is fitted on
    `fit_rows` (another run: its errors on `rows` are then out of sample) or
    on `rows`."""
    os.makedirs(out_dir, exist_ok=True)
    csv_path = os.path.join(out_dir, "bench_hosts.csv")
    with open(csv_path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=["rate", "layout", "hosts", "ranks_per_host", "bytes", "impl", "seconds",
                                           "link_fraction", "others_cores"])
        wr.writeheader()
        for r in rows:
            others = r.get("others_cores")
            wr.writerow({**r, "link_fraction": f"{link_fraction(r):.4f}",
                         "others_cores": "" if others is None else f"{others:.3f}"})
    model = hosts_model.fit(fit_rows or rows)
    errs = {(e["rate"], e["layout"], e["bytes"]): e for e in hosts_model.errors(rows, model, fit_rows)}
    by = {(r["rate"], r["layout"], r["bytes"], r["impl"]): r for r in rows}
    has_mpi = any(r["impl"] == "openmpi" for r in rows)
    has_sharded = any(r["impl"] == "fastpar_sharded" for r in rows)
    mpi_head = f" {'mpi ms':>9} {'fp/mpi':>6} |" if has_mpi else ""
    shard_head = f" {'shard ms':>9} {'lead/shard':>10} |" if has_sharded else ""
    print(f"\n{'rate':>6} {'layout':>6} {'bytes':>9} | {'gloo ms':>9} {'fastpar ms':>10} {'gloo/fp':>7} |{mpi_head}"
          f"{shard_head} {'link frac gloo':>14} {'fastpar':>7} | {'model ms':>8} {'err':>5} {'held':>5} {'levels':>6}")
    pct = lambda x: f"{x * 100:+4.0f}%" if x is not None else "    -"  # noqa: E731
    for (rate, layout, nbytes, impl), r in sorted(by.items(), key=lambda kv: (RATES[kv[0][0]], *kv[0][1:3])):
        if impl != "fastpar":
            continue
        g = by[(rate, layout, nbytes, "gloo")]
        o = by.get((rate, layout, nbytes, "openmpi"))
        e = errs[(rate, layout, nbytes)]
        mpi_cols = (f" {o['seconds'] * 1e3:9.3f} {r['seconds'] / o['seconds']:6.2f} |" if o else
                    f" {'-':>9} {'-':>6} |") if has_mpi else ""
        sh = by.get((rate, layout, nbytes, "fastpar_sharded"))
        shard_cols = (f" {sh['seconds'] * 1e3:9.3f} {r['seconds'] / sh['seconds']:10.2f} |" if sh else
                      f" {'-':>9} {'-':>10} |") if has_sharded else ""
        print(f"{rate:>6} {layout:>6} {fmt_bytes(nbytes):>9} | {g['seconds'] * 1e3:9.3f} {r['seconds'] * 1e3:10.3f} "
              f"{g['seconds'] / r['seconds']:7.2f} |{mpi_cols}{shard_cols} {link_fraction(g):14.3f} "
              f"{link_fraction(r):7.3f} | "
              f"{e['model_s'] * 1e3:8.3f} {pct(e['error'])} {pct(e['error_held_out'])} {pct(e['error_levels_only'])}")
    for (rate, layout), others in sorted({(r["rate"], r["layout"]): r.get("others_cores") for r in rows}.items()):
        if others is not None:
            print(f"{rate} {layout}: other work kept {others:.2f} cores busy while the ranks ran")
    if has_sharded:
        print("\nlead/shard: fastpar's all_reduce time under the leaders' schedule (the default) over its time under "
              "FASTPAR_HOSTS_ALLREDUCE=sharded, same run (above 1: sharded is faster)")
    if has_mpi:
        print("\nfp/mpi: fastpar's time over Open MPI's (mpirun across the same hosts, the same links; below 1: "
              "fastpar is faster)")
    else:
        why = mpi_baseline.missing()
        print("\nOpen MPI: not timed (" + (why if why else "these rows have none: an earlier run without it") + ")")
    for rate in sorted({r["rate"] for r in rows}):
        lk = model[f"inter_{rate}"]  # of 2 leaders' ring, per byte sent, as measured (both on this machine's cores)
        per_byte = lk["beta_s_per_byte"] + 2 * lk["cpu_s_per_byte_per_sharing_host"]
        lk["effective_link_fraction_2_hosts"] = 8 / per_byte / RATES[rate] if per_byte > 0 else None
    print(f"\ncost model (levels fitted on the intra and inter rows, composition on the fastpar rows"
          f"{' of --fit-from' if fit_rows else ''}): {json.dumps(model, indent=1, default=float)}")
    print("err: the model; held: a_c and c fitted without the layout's fastpar points; levels: a_c = c = 0")
    for rate in sorted({r["rate"] for r in rows}, key=RATES.get):
        for lo, label in ((0, "every size"), (MIN_REPORTED, f"from {fmt_bytes(MIN_REPORTED)}")):
            pts = [e for e in errs.values() if e["rate"] == rate and e["bytes"] >= lo]
            line = []
            for key, name in (("error", "model"), ("error_held_out", "held out"), ("error_levels_only", "levels only")):
                xs = [e[key] for e in pts if e[key] is not None]
                if xs:
                    line.append(f"{name} {sum(abs(x) <= 0.25 for x in xs)}/{len(xs)} within 25% "
                                f"({min(xs) * 100:+.0f}% to {max(xs) * 100:+.0f}%)")
            print(f"{rate} {label}: " + "; ".join(line))
    preds = {}
    for rate in sorted({r["rate"] for r in rows}, key=RATES.get):
        for H, R in ((8, 8), (64, 8)):
            for S in (1 << 20, 64 << 20, 256 << 20):
                t = hosts_model.predict(model, S, H, R, rate, sharing=1)  # hosts with cores of their own
                preds[f"{rate} {H}x{R} {fmt_bytes(S)}"] = t
                print(f"predicted {rate} {H}x{R} {fmt_bytes(S):>8}: {t * 1e3:9.2f} ms, link fraction "
                      f"{hosts_model.sent(S, H) * 8 / t / RATES[rate]:.3f}")
    with open(os.path.join(out_dir, "bench_hosts_model.json"), "w") as f:
        json.dump({"model": model, "errors": list(errs.values()), "predictions_s": preds}, f, indent=1,
                  default=float)
    plot(rows, os.path.join(out_dir, "bench_hosts.png"))
    print(f"\nwrote {csv_path}, bench_hosts.png and bench_hosts_model.json in {out_dir}")


def read_csvs(paths: str) -> list[dict]:
    """The rows of bench_hosts.csv files (comma-separated paths: a run made in pieces)."""
    rows = []
    for path in paths.split(","):
        with open(path) as f:
            rows += [{"rate": r["rate"], "layout": r["layout"], "hosts": int(r["hosts"]),
                      "ranks_per_host": int(r["ranks_per_host"]), "bytes": int(r["bytes"]), "impl": r["impl"],
                      "seconds": float(r["seconds"]),
                      # runs before this column was written have none
                      "others_cores": float(r["others_cores"]) if r.get("others_cores") else None}
                     for r in csv.DictReader(f)]
    return rows


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = sorted({r["rate"] for r in rows}, key=RATES.get)
    layouts = sorted({r["layout"] for r in rows})
    fig, axes = plt.subplots(1, len(rates), figsize=(6 * len(rates), 4.5), squeeze=False)
    for ax, rate in zip(axes[0], rates):
        for k, layout in enumerate(layouts):  # a colour per layout, a line style per implementation
            for impl, style in (("fastpar", "-o"), ("fastpar_sharded", "-.s"), ("gloo", "--x"), ("openmpi", ":+")):
                pts = sorted((r["bytes"], link_fraction(r)) for r in rows
                             if r["rate"] == rate and r["layout"] == layout and r["impl"] == impl)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=f"C{k}", label=f"{impl} {layout}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("all_reduce bytes")
        ax.set_ylabel("link fraction (2(H-1)/H S / time / rate)")
        ax.set_title(f"links at {rate}")
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="1 Gbit/s, 2x2 and 3x2, up to 16 MiB")
    ap.add_argument("--max-bytes", type=int, default=None, help="largest all_reduce (default 256 MiB, quick 16 MiB)")
    ap.add_argument("--rates", default=None, help="comma-separated tc rates (default 1gbit,10gbit)")
    ap.add_argument("--layouts", default=None, help="comma-separated HxR (default 2x2,2x3,3x2)")
    ap.add_argument("--budget", type=float, default=0.4, help="seconds of timed calls per size and implementation")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds that take turns between the implementations, each a share of --budget; "
                         "a time is the median of its rounds")
    ap.add_argument("--out", default=".", help="folder for the CSV, PNG and model")
    ap.add_argument("--from-csv", default=None,
                    help="report (table, model, plot) from earlier runs' CSVs (comma-separated: runs in pieces)")
    ap.add_argument("--fit-from", default=None,
                    help="fit the model on these CSVs (another run) and show its errors on --from-csv's rows")
    a = ap.parse_args()
    if a.worker:
        worker(a.max_bytes, a.budget, a.rounds)
        return
    if a.fit_from and not a.from_csv:
        raise SystemExit("bench_hosts.py: --fit-from needs --from-csv (the rows that the model is tested on)")
    if a.from_csv:
        report(read_csvs(a.from_csv), a.out, read_csvs(a.fit_from) if a.fit_from else None)
        return
    from netns_hosts import missing

    why = missing()
    if why:
        raise SystemExit(f"bench_hosts.py: cannot make hosts: {why}")
    max_bytes = a.max_bytes or ((16 << 20) if a.quick else (256 << 20))
    rates = (a.rates or ("1gbit" if a.quick else "1gbit,10gbit")).split(",")
    layouts = (a.layouts or ("2x2,3x2" if a.quick else "2x2,2x3,3x2")).split(",")
    if a.rounds < 1:
        raise SystemExit(f"bench_hosts.py: --rounds is {a.rounds} but must be at least 1")
    for r in rates:
        if r not in RATES:
            raise SystemExit(f"bench_hosts.py: --rates has {r!r}; known rates: {', '.join(RATES)}")
    rows = []
    for rate in rates:
        for layout in layouts:
            H, R = (int(x) for x in layout.split("x"))
            t0 = time.monotonic()
            got, others = run_layout(H, R, rate, max_bytes, a.budget, a.rounds, timeout=900)
            rows += got
            print(f"{layout} at {rate}: {time.monotonic() - t0:.0f} s; other work kept {others:.2f} of the "
                  f"{os.cpu_count()} cores busy while the ranks ran", flush=True)
    report(rows, a.out)


if __name__ == "__main__":
    main()
