"""Training throughput: fastpar DDP vs stock DDP over gloo vs no communication.

    .venv/bin/python benchmarks/bench_training.py                 # 2 ranks, 3 rounds
    .venv/bin/python benchmarks/bench_training.py --quick         # 1 round, short
    .venv/bin/python benchmarks/bench_training.py --rounds 5 --data /path/to/fashion-mnist

LeNet, one thread per rank, the same seed, data and steps in every mode
(benchmarks/training/modes.py). All modes live in the same processes and
take turns step by step, each step starting from a barrier, so that load from
other processes on the machine hits all of them alike; --rounds repeats that
in fresh processes. samples/s is the global batch over the median step
time, each step timed by its slowest rank (wall: over the mean); for
no_comm that is the bound for any synchronous scheme. The table reports each
mode's median over rounds, its samples/s over the first mode's (default
no_comm, the upper bound) and its paired ratio to stock DDP: per round the
median over the steps of stock DDP's step time / this mode's (the modes took
step i one after another, training/modes.py paired_ratio), then the median
over rounds. All measured in this run.

After `bash scripts/setup.sh` run them with .venv/bin/python; any other Python
with torch needs PYTHONPATH=. and an in-place build (setup.py build_ext --inplace).
"""
import argparse
import csv
import os
import statistics
import tempfile

from training import modes as tb
from training.progress import ProgressBar

MODES = ("no_comm", "fastpar_ddp", "stock_ddp_gloo")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=None, help="interleaved repetitions (default 3, --quick 1)")
    ap.add_argument("--epochs", type=float, default=None, help="epochs per run (default 2, --quick 0.5)")
    ap.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--data", default=None, help="folder of Fashion-MNIST IDX files (default: synthetic)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"comma-separated, from {list(tb.MODES)} (default: {','.join(MODES)})")
    ap.add_argument("--csv", default="bench_out/training.csv", help="every run and the medians ('' for none)")
    args = ap.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in tb.MODES:
            ap.error(f"--modes: {m!r} is not one of {list(tb.MODES)}")
    cfg = tb.Config(world=args.world, batch_per_rank=args.batch, bucket_cap_mb=args.bucket_cap_mb,
                    epochs=args.epochs or (0.5 if args.quick else 2.0), data_path=args.data)
    data_file, description = tb.prepare_data(cfg, tempfile.mkdtemp(prefix="fastpar_bench_"))
    print(f"data: {description}")
    print(f"LeNet, {cfg.world} ranks x {cfg.batch_per_rank} samples, {cfg.steps()} steps per mode "
          f"({cfg.warmup_steps} untimed), modes interleaved step by step, {rounds} round(s)")
    runs = []
    for r in range(rounds):
        bar = ProgressBar(cfg.steps(), f"round {r + 1}/{rounds}: all modes")
        try:
            results = tb.run_modes(modes, cfg, data_file, on_progress=lambda n, total: bar.update_to(n))
        finally:
            bar.close()
        if "stock_ddp_gloo" in modes:
            tb.add_paired_ratios(results, "stock_ddp_gloo")
        for res in results:
            res["round"] = r + 1
            runs.append(res)
    medians = []
    for mode in modes:
        mine = [x for x in runs if x["mode"] == mode]
        row = dict(mine[0], run="-")  # the rounds' median: of no single run
        row["samples_per_s"] = statistics.median(x["samples_per_s"] for x in mine)
        row["wall_samples_per_s"] = statistics.median(x["wall_samples_per_s"] for x in mine)
        if "vs_stock_ddp_gloo_paired" in row:
            row["vs_stock_ddp_gloo_paired"] = statistics.median(x["vs_stock_ddp_gloo_paired"] for x in mine)
        row["round"] = "median"
        medians.append(row)
    print()
    print(tb.format_table(medians, baseline_mode=modes[0],
                          paired_baseline="stock_ddp_gloo" if "stock_ddp_gloo" in modes else None))
    for x in medians:
        if x["mode"].startswith("fastpar_ddp"):
            print(f"{x['label']}: backend {x['backend']}, bucket storage {x['bucket_storage']}")
    if args.csv:  # '' disables
        os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(tb.csv_row(runs[0])))
            w.writeheader()
            w.writerows(tb.csv_row(x) for x in runs + medians)
        print(f"CSV: {args.csv}")


if __name__ == "__main__":
    main()
