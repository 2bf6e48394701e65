"""The README's "Measured" table, from the CSVs of named benchmark commands.

    python benchmarks/readme_table.py --run     # runs every row's command (about 5 minutes on 2 cores), then the table
    python benchmarks/readme_table.py           # the table from the CSVs of the last --run
    python benchmarks/readme_table.py --run --only latency,training   # rerun some rows

--run refuses an extension older than any csrc/ file. Each row's command writes
one CSV under --dir (default benchmarks/results/readme/);
runs.csv there records, for each row, the command, the date, the git commit and
whether the checkout had uncommitted changes, and the machine (CPU model, cores).
The table (markdown, on stdout and in --dir/table.md) shows every row, and below
it the command that produced each; the GPU line counts the targets met in
benchmarks/results/gpu/summary.txt (written by scripts/gpu_check.sh on a GPU
machine, not by this script). Run it on a quiet machine: the benchmarks take
the best of a few samples, but a busy neighbour still moves the numbers.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import subprocess
import sys
from typing import Callable, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KiB, MiB = 1 << 10, 1 << 20


def read(path: str) -> List[Dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def rng(values, fmt="{:.2f}", suffix="") -> str:
    lo, hi = min(values), max(values)
    return (fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}-{fmt.format(hi)}") + suffix


# ---------------------------------------------------------------- the rows
# Each row: a key, what it measures, the command (relative to the checkout;
# {csv} is the row's CSV) and a function from the CSV's rows to the cell.

def cell_lists(rows):
    big = [r for r in rows if int(r["bytes"]) >= MiB]
    ks = sorted({int(r["k"]) for r in big})
    sizes = sorted({int(r["bytes"]) for r in big})
    return (f"{rng([float(r['vs_baseline']) for r in big], '{:.1f}', 'x')} torch `stack().sum(0)` + copies; "
            f"{rng([float(r['of_ceiling']) for r in big])} of a plain copy "
            f"(k = {', '.join(map(str, ks))}; {sizes[0] // MiB}-{sizes[-1] // MiB} MiB per tensor)")


def cell_distributed(rows):
    from_64k = [r for r in rows if int(r["bytes"]) >= 64 * KiB]
    at_4k = [r for r in rows if int(r["bytes"]) == 4 * KiB]
    sizes = sorted(int(r["bytes"]) for r in from_64k)
    text = (f">= {min(float(r['fastpar_over_gloo']) for r in from_64k):.1f}x gloo's bus bandwidth "
            f"from {sizes[0] // KiB} KiB to {sizes[-1] // MiB} MiB")
    if at_4k:
        text += f" ({float(at_4k[0]['fastpar_over_gloo']):.0f}x at 4 KiB)"
    return text


def cell_latency(rows):
    us = {r["path"]: float(r["us_per_call"]) for r in rows}
    text = (f"direct call {us['fastpar direct']:.2f} us, `dist.all_reduce` {us['fastpar']:.2f} us, "
            f"gloo {us['gloo']:.0f} us")
    mpi = us.get("Open MPI (mpirun, shared memory)")
    if mpi:
        text += f"; direct / Open MPI `MPI_Allreduce` {us['fastpar direct'] / mpi:.2f}x"
    return text


def cell_tensor_parallel(rows):
    by = {r["mode"]: r for r in rows}
    fp = by["fastpar"]
    return (f"{float(fp['vs_gloo']):.2f}x the tokens/s of gloo; {float(fp['vs_1_process']):.2f}x one process "
            f"({fp['layers']} layers, d_model {fp['d_model']}, {fp['steps']} tokens)")


def cell_training(rows):
    """Step times paired with stock DDP's in the same processes (bench_training's
    vs_stock_ddp_gloo_paired, median of the rounds); the no-communication bound
    is the same ratio of the mode that skips the all_reduce."""
    med = {r["mode"]: float(r["vs_stock_ddp_gloo_paired"]) for r in rows if r.get("round") == "median"}
    fp = med["fastpar_ddp"]
    return (f"{fp:.3f}x stock DDP over gloo; {fp / med['no_comm']:.3f} of a no-communication bound "
            f"(step times paired in the same processes, median of the rounds)")


ROWS = [
    ("lists", "list allreduce, k CPU tensors in one process",
     "benchmarks/bench_single_process.py --quick --ks 2,8 --csv {csv} --plot {dir}/single_process.png",
     cell_lists),
    ("distributed", "`dist.all_reduce`, 2 processes",
     "benchmarks/bench_distributed.py --quick --csv {csv}", cell_distributed),
    ("latency", "4 KiB all_reduce, 2 processes",
     "benchmarks/bench_latency.py --iters 5000 --repeats 3 --csv {csv}", cell_latency),
    ("tensor_parallel", "tensor-parallel inference on 2 cores (example)",
     "examples/tensor_parallel_inference.py --csv {csv}", cell_tensor_parallel),
    ("training", "LeNet DDP, 2 processes",
     "benchmarks/bench_training.py --rounds 3 --epochs 0.5 --csv {csv}", cell_training),
]


def command(template: str, out_dir: str, key: str) -> List[str]:
    rel = os.path.relpath(out_dir, ROOT)
    return template.format(csv=f"{rel}/{key}.csv", dir=rel).split()


def git(*args) -> str:
    r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "?"


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} CPUs"


def stale_extension() -> str:
    """Why the built extension may not be the checkout's code ('' when it is):
    runs.csv names a commit, so the .so must be built from it."""
    import glob
    built = glob.glob(os.path.join(ROOT, "fastpar", "_C*.so"))
    if not built:
        return "no extension built in this checkout (python setup.py build_ext --inplace)"
    so_time = min(os.path.getmtime(p) for p in built)
    for base in ("csrc", "setup.py"):
        paths = [os.path.join(ROOT, base)] if base.endswith(".py") else [
            os.path.join(d, f) for d, _, fs in os.walk(os.path.join(ROOT, base)) for f in fs]
        newer = [p for p in paths if os.path.getmtime(p) > so_time]
        if newer:
            return (f"{os.path.relpath(newer[0], ROOT)} is newer than the extension: rebuild it "
                    f"(python setup.py build_ext --inplace)")
    return ""


FIELDS = ["row", "command", "date_utc", "commit", "uncommitted_changes", "machine", "seconds", "load_before"]


def run_rows(keys: List[str], out_dir: str, nice: bool) -> None:
    why = stale_extension()
    if why:
        sys.exit(f"readme_table: {why}")
    os.makedirs(out_dir, exist_ok=True)
    log_path = os.path.join(out_dir, "runs.csv")
    runs = {r["row"]: r for r in read(log_path)} if os.path.exists(log_path) else {}
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # Whether the code differs from the commit, read before any row runs, and
    # not counting the results themselves (the rows rewrite them).
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                f":(exclude){os.path.relpath(out_dir, ROOT)}")
    for key, what, template, _ in ROWS:
        if key not in keys:
            continue
        cmd = command(template, out_dir, key)
        print(f"== {key}: python {' '.join(cmd)}", flush=True)
        full = (["nice"] if nice else []) + [sys.executable] + cmd
        t0 = datetime.datetime.now(datetime.timezone.utc)
        load = os.getloadavg()[0]
        done = subprocess.run(full, cwd=ROOT, env=env)
        if done.returncode != 0:
            sys.exit(f"readme_table: {key} failed (exit {done.returncode}): python {' '.join(cmd)}")
        runs[key] = {"row": key, "command": "python " + " ".join(cmd),
                     "date_utc": t0.strftime("%Y-%m-%d %H:%M"), "commit": git("rev-parse", "--short", "HEAD"),
                     "uncommitted_changes": "yes" if dirty else "no",
                     "machine": machine(), "seconds": f"{(datetime.datetime.now(datetime.timezone.utc) - t0).total_seconds():.0f}",
                     # other jobs on the machine move the numbers: the 1-minute load average before the run
                     "load_before": f"{load:.1f}"}
        with open(log_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS, restval="")
            w.writeheader()
            w.writerows(runs[k] for k, *_ in ROWS if k in runs)


def gpu_line(summary_path: str) -> str:
    if not os.path.exists(summary_path):
        return ""
    lines = open(summary_path).read().splitlines()
    date = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("date")), "?")
    gpus = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("GPUs")), "?")
    status, unmeasured = [], []
    for line in lines:
        words = line.split()
        if ">=" not in words and "<=" not in words:
            continue
        if "not measured" in line:
            status.append("-")
            unmeasured.append(line.split("  ")[0].strip())
        else:
            status.append("met" if words[-1] == "met" or "met" in words[-4:-1] else "MISSED")
    met, missed = status.count("met"), status.count("MISSED")
    return (f"GPU targets ({gpus}, {date} UTC, `bash scripts/gpu_check.sh`, "
            f"`{os.path.relpath(summary_path, ROOT)}`): {met} of {len(status)} met, {missed} missed, "
            f"{len(unmeasured)} not measured ({'; '.join(unmeasured)}).")


def gpu_numbers(csv_path: str) -> str:
    """The headline GPU figures of gpu_check.sh's bench_cuda.csv (one GPU, ranks sharing it)."""
    if not os.path.exists(csv_path):
        return ""
    rows = read(csv_path)

    def us(backend, ranks, nbytes):
        r = [x for x in rows if x["part"] == "ipc" and x["backend"] == backend and x["ranks"] == str(ranks)
             and x["bytes"] == str(nbytes) and x["us"] not in ("", "nan")]
        return float(r[0]["us"]) if r else float("nan")

    of_copy = [float(r["of_copy"]) for r in rows if r["part"] == "lists" and r["algorithm"] == "direct"
               and int(r["bytes"]) >= 16 * MiB and r["of_copy"] not in ("", "nan")]
    return (f"A list allreduce of CUDA tensors on one GPU reaches at least {min(of_copy):.2f} of a "
            f"device-to-device copy from 16 MiB; `dist.all_reduce` between 2 ranks sharing the GPU takes "
            f"{us('fastpar', 2, 4 * KiB):.1f} us at 4 KiB ({us('fastpar graph', 2, 4 * KiB):.1f} us replayed in a "
            f"CUDA graph, {us('fastpar direct', 2, 4 * KiB):.1f} us as the direct call) and "
            f"{us('fastpar', 2, MiB):.1f} us at 1 MiB; 3 and 4 ranks sharing it take "
            f"{us('fastpar', 3, 128 * MiB) / 1000:.1f} and {us('fastpar', 4, 128 * MiB) / 1000:.1f} ms at 128 MiB "
            f"(`{os.path.relpath(csv_path, ROOT)}`).")


def wrap(text: str, width: int = 100) -> str:
    """A paragraph as lines of at most `width` characters (the README keeps every line under 200)."""
    import textwrap
    return "\n".join(textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False))


def table(out_dir: str) -> str:
    """The table, then each row's command below it (a row with its command would run past 200
    characters)."""
    log_path = os.path.join(out_dir, "runs.csv")
    runs = {r["row"]: r for r in read(log_path)} if os.path.exists(log_path) else {}
    out = ["| what | fastpar vs baseline |", "|---|---|"]
    commands = ["", "Each row's command (its CSV in `" + os.path.relpath(out_dir, ROOT) + "/`):", ""]
    provenance: dict[tuple, list[str]] = {}  # (date, commit, dirty, machine) -> the rows run so
    for key, what, _, cell in ROWS:
        path = os.path.join(out_dir, f"{key}.csv")
        if key not in runs or not os.path.exists(path):
            continue  # never run: no claim
        run = runs[key]
        origin = (run["date_utc"][:10], run["commit"], run["uncommitted_changes"], run["machine"])
        provenance.setdefault(origin, []).append(what)
        out.append(f"| {what} | {cell(read(path))} |")
        commands += [f"- {what}:", f"  `{run['command']}`"]
    head = []
    for (date, commit, dirty, mach), whats in sorted(provenance.items()):
        # Rows from several runs: each line names its rows, so no number is read against the wrong commit.
        rows = "" if len(provenance) == 1 else "The rows " + "; ".join(f'"{w}"' for w in whats) + ": run"
        head.append((rows or "Run") + f" on {date} on commit {commit}"
                    + (" plus uncommitted changes" if dirty == "yes" else "")
                    + f", {mach}; baselines measured in the same runs.")
    gpu_dir = os.path.join(ROOT, "benchmarks", "results", "gpu")
    gpu = " ".join(x for x in (gpu_line(os.path.join(gpu_dir, "summary.txt")),
                                gpu_numbers(os.path.join(gpu_dir, "bench_cuda.csv"))) if x)
    body = out + (commands if len(out) > 2 else [])
    return "\n".join(head + [""] + body + ([""] + [wrap(gpu)] if gpu else [])) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="store_true", help="run the rows' commands first")
    ap.add_argument("--only", default=None, help=f"rows to run, comma-separated ({','.join(k for k, *_ in ROWS)})")
    ap.add_argument("--dir", default=os.path.join(ROOT, "benchmarks", "results", "readme"))
    ap.add_argument("--no-nice", action="store_true", help="run the benchmarks at normal priority")
    args = ap.parse_args(argv)
    keys = [k for k, *_ in ROWS] if not args.only else args.only.split(",")
    unknown = set(keys) - {k for k, *_ in ROWS}
    if unknown:
        ap.error(f"--only: unknown rows {sorted(unknown)}")
    out_dir = os.path.abspath(args.dir)
    if args.run:
        run_rows(keys, out_dir, nice=not args.no_nice)
    text = table(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
