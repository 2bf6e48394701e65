"""The main job: data-parallel LeNet training on 2 local CPU processes.

    bash scripts/setup.sh                               # once, in a fresh clone
    .venv/bin/python benchmarks/main_job.py --quick            # ~1-2 minutes
    .venv/bin/python benchmarks/main_job.py --smoke            # every step, tiny: a test runs it
    .venv/bin/python benchmarks/main_job.py             # 3 epochs per mode, a few minutes on 2 cores
    .venv/bin/python benchmarks/main_job.py --data /path/to/fashion-mnist   # real IDX files

Prints samples/s and final test accuracy for fastpar DDP, stock DDP over gloo,
no communication (the same processes and steps without a gradient exchange:
the bound for any data-parallel scheme) and one process, with a progress bar
on stderr, and writes the table as CSV to --out. Needs no GPU and no
download: without --data it trains on synthetic Fashion-MNIST-shaped data
(benchmarks/training/datasets.py), and says so.

The table's columns (printed under it too):
  samples/s                 global batch / median step time, each step timed by its slowest rank
  (wall)                    global batch / mean step time
  vs single                 samples/s over one process's samples/s (one process runs afterwards,
                            in a process of its own: the machine may have changed speed meanwhile)
  vs stock_ddp_gloo, paired the three multi-process modes take turns step by step in the same
                            processes (the order rotating); this is the median over the timed steps
                            of stock DDP's step time / this mode's step time, so each step compares
                            the modes under one machine state. No communication's value is the
                            most any data-parallel scheme can gain over stock DDP here.

Optional: if benchmarks/bench_distributed.py (the collective sweep) exists in
this checkout, it is run afterwards to produce its PNG plot in --out; when it
is missing, or matplotlib is not installed, that step is skipped with a note.
The sweep prints beside every size the copy rate of the ranks' cores, measured
in the same run, and each time as a fraction of its schedule's traffic floor at
that rate (docs/algorithms.md, "The traffic floor of a CPU allreduce").
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile

from training import modes as tb
from training.progress import ProgressBar

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The modes timed together, step by step, and the one the others are paired with
PAIRED_MODES = ("fastpar_ddp", "stock_ddp_gloo", "no_comm")
PAIRED_BASELINE = "stock_ddp_gloo"
# The columns' meanings, printed under the table: the docstring's paragraph on them
LEGEND = __doc__.split("The table's columns (printed under it too):\n", 1)[1].split("\n\n")[0]


def _parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="benchmarks/main_job.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a short run (~1-2 minutes)")
    ap.add_argument("--smoke", action="store_true",
                    help="--quick cut to the minimum (a few steps per mode, the sweep at 2 sizes): checks that "
                         "every step runs; its numbers mean nothing")
    ap.add_argument("--data", default=None, help="folder with the Fashion-MNIST IDX files (default: synthetic)")
    ap.add_argument("--world", type=int, default=2, help="processes for the DDP modes (default 2)")
    ap.add_argument("--epochs", type=float, default=None, help="epochs per mode (default 3 of 12000 samples; --quick: 3 of 8000)")
    ap.add_argument("--batch", type=int, default=64, help="samples per rank per step (default 64)")
    ap.add_argument("--out", default="bench_out", help="folder for the CSV and the plot (default bench_out)")
    ap.add_argument("--no-sweep", action="store_true", help="skip the optional collective sweep plot")
    args = ap.parse_args(argv)
    if args.smoke:
        args.quick = True
        if args.epochs is None:
            args.epochs = 0.01  # Config.steps() still runs the warm-up steps and one timed step
    if args.world < 2:
        ap.error(f"--world is {args.world}; data parallelism needs at least 2 processes")
    return args


def run_training(args: argparse.Namespace) -> list:
    cfg = tb.Config(world=args.world, batch_per_rank=args.batch, data_path=args.data,
                    # --quick keeps 3 epochs (187 steps): the paired ratio is a median over the
                    # timed steps, and one epoch (57 timed steps) moved it by +-0.03 between runs
                    epochs=args.epochs if args.epochs is not None else 3.0,
                    n_train=8000 if args.quick else 12000, n_test=2000)
    data_file, description = tb.prepare_data(cfg, tempfile.mkdtemp(prefix="fastpar_main_"))
    print(f"data: {description}")
    print(f"LeNet, {cfg.world} x {cfg.batch_per_rank} samples per step, {cfg.steps()} steps per mode "
          f"({cfg.warmup_steps} warm-up steps not timed), SGD momentum 0.9, lr {cfg.lr}; fastpar DDP, stock "
          f"DDP and no communication share {cfg.world} processes and take turns step by step")
    rows = []
    for modes, label in ((PAIRED_MODES, "DDP modes, no communication"), (("single",), "one process")):
        bar = ProgressBar(cfg.steps(), label)
        try:
            rows += tb.run_modes(modes, cfg, data_file, on_progress=lambda n, total: bar.update_to(n))
        finally:
            bar.close()
    tb.add_paired_ratios(rows, PAIRED_BASELINE)
    return rows


def write_csv(rows: list, path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(tb.csv_row(rows[0])))
        w.writeheader()
        w.writerows(tb.csv_row(r) for r in rows)


def run_collective_sweep(out_dir: str, quick: bool, smoke: bool = False) -> None:
    """Runs benchmarks/bench_distributed.py when it exists, passing the options its --help offers."""
    # the checkout this package runs from, else the current directory (for an installed fastpar)
    found = [os.path.join(root, "benchmarks", "bench_distributed.py") for root in (_REPO, os.getcwd())]
    found = [p for p in found if os.path.exists(p)]
    if not found:
        print("collective sweep: skipped (benchmarks/bench_distributed.py is not in this checkout)")
        return
    script = found[0]
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(script)) + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    helptext = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, env=env).stdout
    cmd = [sys.executable, script]
    if quick and "--quick" in helptext.split():
        cmd.append("--quick")
    if smoke and "--sizes" in helptext.split():
        cmd += ["--sizes", "4K,1M"]
    for flag, value in (("--plot", "collective_sweep.png"), ("--csv", "collective_sweep.csv")):
        if flag in helptext.split():
            cmd += [flag, os.path.join(out_dir, value)]
    print(f"collective sweep: {' '.join(cmd)}")
    done = subprocess.run(cmd, env=env)
    if done.returncode != 0:
        print(f"collective sweep: exited with code {done.returncode} (the training table above stands)")


def main(argv=None) -> None:
    args = _parse(argv)
    os.makedirs(args.out, exist_ok=True)
    rows = run_training(args)
    print()
    print(tb.format_table(rows, baseline_mode="single", paired_baseline=PAIRED_BASELINE))
    print(LEGEND)
    csv_path = os.path.join(args.out, "train_main.csv")
    write_csv(rows, csv_path)
    print(f"\nCSV: {csv_path}")
    if not args.no_sweep:
        run_collective_sweep(args.out, args.quick, args.smoke)


if __name__ == "__main__":
    main()
