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
(4) "inter": gloo's all_reduce among the leaders. Open MPI is timed only if
mpi4py is installed (it is not in the default environment: the row says so).

A time is the slowest rank's mean over the iterations. The "link fraction" is
the bytes every host must send and receive for an all_reduce of S bytes over
H hosts, 2 (H-1)/H S, over the time and the link rate: 1.0 means the links
were busy all the time with nothing but necessary bytes.

The cost model: alpha-beta per level, fitted on (3) and (4):
intra(S, R) = a_s + b_s(R) S, with b_s(R) linear in R; inter(S, H) =
2 (H-1) a_l + 2 (H-1)/H S b_l (a ring among the leaders, gloo's). fastpar's
all_reduce is predicted from them (predict(): one piece below 2 MiB, else
the pipeline of pieces hierarchical_engine.cpp runs), compared with (1), and
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
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RATES = {"1gbit": 1e9, "10gbit": 10e9}


# ----------------------------------------------------------------------------- worker (one rank, under torchrun)
def worker(max_bytes: int, budget_s: float) -> None:
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
    ctl = torch.zeros(1)

    def agree_max(x: float) -> float:
        ctl.fill_(x)
        dist.all_reduce(ctl, op=dist.ReduceOp.MAX)
        return float(ctl.item())

    def timed(fn, active: bool) -> float:
        """Slowest rank's mean seconds per call; ranks not `active` only wait."""
        dist.barrier()
        t0 = time.perf_counter()
        if active:
            fn()
        first = agree_max(time.perf_counter() - t0 if active else 0.0)
        n = int(max(1, min(200, budget_s / max(first, 1e-6))))
        dist.barrier()
        t0 = time.perf_counter()
        if active:
            for _ in range(n):
                fn()
        return agree_max((time.perf_counter() - t0) / n if active else 0.0)

    sizes = []
    s = 4096
    while s <= max_bytes:
        sizes.append(s)
        s *= 4 if s < (1 << 20) else 2 if s < (16 << 20) else 4
    for nbytes in sizes:
        t = torch.ones(nbytes // 4)
        rows = {
            "fastpar": timed(lambda: dist.all_reduce(t), True),
            "gloo": timed(lambda: dist.all_reduce(t, group=world_gloo), True),
            "intra": timed(lambda: (dist.reduce(t, dst=hosts[host[rank]][0], group=mine),
                                    dist.broadcast(t, src=hosts[host[rank]][0], group=mine)), True),
            "inter": timed(lambda: dist.all_reduce(t, group=leaders_gloo), rank in leaders),
        }
        if rank == 0:
            for impl, sec in rows.items():
                print("BENCH " + json.dumps({"bytes": nbytes, "impl": impl, "seconds": sec}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- driver
def run_layout(H: int, R: int, rate: str, max_bytes: int, budget_s: float, timeout: float) -> list[dict]:
    sys.path.insert(0, os.path.join(ROOT, "tests", "multihost"))
    from netns_hosts import Hosts

    with Hosts(H, rate=rate) as hs:
        env = lambda h: hs.env({"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),  # noqa: E731
                                "FASTPAR_BIND_CORES": "0"})
        script = [os.path.abspath(__file__), "--worker", "--max-bytes", str(max_bytes), "--budget", str(budget_s)]
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
    rows = []
    for out in outs:
        for line in out.splitlines():
            if line.startswith("BENCH "):
                r = json.loads(line[6:])
                r.update(layout=f"{H}x{R}", hosts=H, ranks_per_host=R, rate=rate)
                rows.append(r)
    return rows


def link_fraction(row: dict) -> float:
    H, S = row["hosts"], row["bytes"]
    must = 2 * (H - 1) / H * S
    return must * 8 / row["seconds"] / RATES[row["rate"]]


def fit(rows: list[dict]) -> dict:
    """Least squares, relative error weighted (each point counts the same
    whatever its size), of the two levels' alpha-beta models."""
    import numpy as np

    model = {}
    intra = [r for r in rows if r["impl"] == "intra"]
    # intra(S, R) = a_s + (b0 + b1 R) S
    A = np.array([[1.0, r["bytes"], r["bytes"] * r["ranks_per_host"]] for r in intra])
    y = np.array([r["seconds"] for r in intra])
    w = 1 / y
    a_s, b0, b1 = np.linalg.lstsq(A * w[:, None], y * w, rcond=None)[0]
    model["intra"] = {"alpha_s": a_s, "beta0_s_per_byte": b0, "beta1_s_per_byte_per_rank": b1}
    for rate in sorted({r["rate"] for r in rows}):
        inter = [r for r in rows if r["impl"] == "inter" and r["rate"] == rate]
        # inter(S, H) = 2 (H-1) a_l + 2 (H-1)/H S b_l
        A = np.array([[2 * (r["hosts"] - 1), 2 * (r["hosts"] - 1) / r["hosts"] * r["bytes"]] for r in inter])
        y = np.array([r["seconds"] for r in inter])
        w = 1 / y
        a_l, b_l = np.linalg.lstsq(A * w[:, None], y * w, rcond=None)[0]
        model[f"inter_{rate}"] = {"alpha_s": a_l, "beta_s_per_byte": b_l,
                                  "effective_link_fraction": 8 / b_l / RATES[rate] if b_l > 0 else None}
    return model


def predict(model: dict, S: float, H: int, R: int, rate: str) -> float:
    """fastpar's all_reduce of S bytes: one piece below 2 MiB (intra + inter),
    else p = min(8, S / 1 MiB) pieces pipelined (hierarchical_engine.cpp):
    the first piece's intra and inter, then p - 1 times the slower of the two."""
    i = model["intra"]
    lk = model[f"inter_{rate}"]

    def intra(s):
        return max(0.0, i["alpha_s"] + (i["beta0_s_per_byte"] + i["beta1_s_per_byte_per_rank"] * R) * s)

    def inter(s):
        return max(0.0, 2 * (H - 1) * lk["alpha_s"] + 2 * (H - 1) / H * s * lk["beta_s_per_byte"])

    p = min(8, int(S // (1 << 20)))
    if p < 2:
        return intra(S) + inter(S)
    s = S / p
    return intra(s) + inter(s) + (p - 1) * max(intra(s), inter(s))


def fmt_bytes(n: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:g} {unit}"
    return f"{n} B"


def report(rows: list[dict], out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    csv_path = os.path.join(out_dir, "bench_hosts.csv")
    with open(csv_path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=["rate", "layout", "hosts", "ranks_per_host", "bytes", "impl", "seconds",
                                           "link_fraction"])
        wr.writeheader()
        for r in rows:
            wr.writerow({**r, "link_fraction": f"{link_fraction(r):.4f}"})
    model = fit(rows)
    by = {(r["rate"], r["layout"], r["bytes"], r["impl"]): r for r in rows}
    print(f"\n{'rate':>6} {'layout':>6} {'bytes':>9} | {'gloo ms':>9} {'fastpar ms':>10} {'gloo/fp':>7} | "
          f"{'link frac gloo':>14} {'fastpar':>7} | {'model ms':>8} {'err':>6}")
    errors = []
    for (rate, layout, nbytes, impl), r in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        if impl != "fastpar":
            continue
        g = by[(rate, layout, nbytes, "gloo")]
        m = predict(model, nbytes, r["hosts"], r["ranks_per_host"], rate)
        err = m / r["seconds"] - 1
        errors.append((rate, layout, nbytes, err))
        print(f"{rate:>6} {layout:>6} {fmt_bytes(nbytes):>9} | {g['seconds'] * 1e3:9.3f} {r['seconds'] * 1e3:10.3f} "
              f"{g['seconds'] / r['seconds']:7.2f} | {link_fraction(g):14.3f} {link_fraction(r):7.3f} | "
              f"{m * 1e3:8.3f} {err * 100:5.0f}%")
    print("\nOpen MPI: " + ("mpi4py is installed but this benchmark does not drive mpirun in namespaces yet"
                           if _has_mpi4py() else "not timed (mpi4py is not installed)"))
    worst = max(errors, key=lambda e: abs(e[3]))
    within = sum(abs(e[3]) <= 0.25 for e in errors)
    print(f"\ncost model (fitted on the intra and inter rows): {json.dumps(model, indent=1, default=float)}")
    print(f"model vs measured fastpar: {within} of {len(errors)} points within 25%; worst {worst[3] * 100:+.0f}% "
          f"({worst[0]} {worst[1]} {fmt_bytes(worst[2])})")
    preds = {}
    for rate in sorted({r["rate"] for r in rows}):
        for H, R in ((8, 8), (64, 8)):
            for S in (1 << 20, 64 << 20, 256 << 20):
                t = predict(model, S, H, R, rate)
                preds[f"{rate} {H}x{R} {fmt_bytes(S)}"] = t
                print(f"predicted {rate} {H}x{R} {fmt_bytes(S):>8}: {t * 1e3:9.2f} ms, link fraction "
                      f"{2 * (H - 1) / H * S * 8 / t / RATES[rate]:.3f}")
    with open(os.path.join(out_dir, "bench_hosts_model.json"), "w") as f:
        json.dump({"model": model, "errors": [{"rate": a, "layout": b, "bytes": c, "relative_error": d}
                                              for a, b, c, d in errors], "predictions_s": preds}, f, indent=1,
                  default=float)
    plot(rows, os.path.join(out_dir, "bench_hosts.png"))
    print(f"\nwrote {csv_path}, bench_hosts.png and bench_hosts_model.json in {out_dir}")


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = sorted({r["rate"] for r in rows})
    fig, axes = plt.subplots(1, len(rates), figsize=(6 * len(rates), 4.5), squeeze=False)
    for ax, rate in zip(axes[0], rates):
        for layout in sorted({r["layout"] for r in rows}):
            for impl, style in (("fastpar", "-o"), ("gloo", "--x")):
                pts = sorted((r["bytes"], link_fraction(r)) for r in rows
                             if r["rate"] == rate and r["layout"] == layout and r["impl"] == impl)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=f"{impl} {layout}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("all_reduce bytes")
        ax.set_ylabel("link fraction (2(H-1)/H S / time / rate)")
        ax.set_title(f"links at {rate}")
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _has_mpi4py() -> bool:
    try:
        import mpi4py  # noqa: F401
        return True
    except ImportError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="1 Gbit/s, 2x2 and 3x2, up to 16 MiB")
    ap.add_argument("--max-bytes", type=int, default=None, help="largest all_reduce (default 256 MiB, quick 16 MiB)")
    ap.add_argument("--rates", default=None, help="comma-separated tc rates (default 1gbit,10gbit)")
    ap.add_argument("--layouts", default=None, help="comma-separated HxR (default 2x2,2x3,3x2)")
    ap.add_argument("--budget", type=float, default=0.4, help="seconds of timed calls per size and implementation")
    ap.add_argument("--out", default=".", help="folder for the CSV, PNG and model")
    ap.add_argument("--from-csv", default=None, help="report (table, model, plot) from an earlier run's CSV")
    a = ap.parse_args()
    if a.worker:
        worker(a.max_bytes, a.budget)
        return
    if a.from_csv:
        with open(a.from_csv) as f:
            rows = [{"rate": r["rate"], "layout": r["layout"], "hosts": int(r["hosts"]),
                     "ranks_per_host": int(r["ranks_per_host"]), "bytes": int(r["bytes"]), "impl": r["impl"],
                     "seconds": float(r["seconds"])} for r in csv.DictReader(f)]
        report(rows, a.out)
        return
    sys.path.insert(0, os.path.join(ROOT, "tests", "multihost"))
    from netns_hosts import missing

    why = missing()
    if why:
        raise SystemExit(f"bench_hosts.py: cannot make hosts: {why}")
    max_bytes = a.max_bytes or ((16 << 20) if a.quick else (256 << 20))
    rates = (a.rates or ("1gbit" if a.quick else "1gbit,10gbit")).split(",")
    layouts = (a.layouts or ("2x2,3x2" if a.quick else "2x2,2x3,3x2")).split(",")
    for r in rates:
        if r not in RATES:
            raise SystemExit(f"bench_hosts.py: --rates has {r!r}; known rates: {', '.join(RATES)}")
    rows = []
    for rate in rates:
        for layout in layouts:
            H, R = (int(x) for x in layout.split("x"))
            t0 = time.monotonic()
            rows += run_layout(H, R, rate, max_bytes, a.budget, timeout=900)
            print(f"{layout} at {rate}: {time.monotonic() - t0:.0f} s", flush=True)
    report(rows, a.out)


if __name__ == "__main__":
    main()
