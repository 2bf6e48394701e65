"""benchmarks/readme_table.py on synthetic CSVs: a row is shown only when its
command ran (runs.csv) and its CSV exists, with that command below the table; the
run's date, commit and machine head the table (each run's rows named, when
rows come from several); the GPU line counts the targets of a gpu_check
summary."""
import csv
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import readme_table  # noqa: E402


def write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def test_only_rows_that_ran_with_their_commands(tmp_path):
    write(tmp_path / "latency.csv", [
        {"path": "gloo", "bytes": 4096, "ranks": 2, "us_per_call": 1200.0},
        {"path": "fastpar direct", "bytes": 4096, "ranks": 2, "us_per_call": 1.25},
        {"path": "fastpar", "bytes": 4096, "ranks": 2, "us_per_call": 4.9}])
    write(tmp_path / "training.csv", [
        {"mode": m, "samples_per_s": v, "round": "median"}
        for m, v in (("no_comm", 1000.0), ("fastpar_ddp", 950.0), ("stock_ddp_gloo", 800.0))])
    cmd = "python benchmarks/bench_latency.py --csv x.csv"
    write(tmp_path / "runs.csv", [
        {"row": "latency", "command": cmd, "date_utc": "2026-11-27 18:00", "commit": "abc1234",
         "uncommitted_changes": "no", "machine": "Some CPU, 2 CPUs", "seconds": 30},
        # ran, but its CSV is gone: no claim
        {"row": "lists", "command": "python x", "date_utc": "2026-11-27 18:00", "commit": "abc1234",
         "uncommitted_changes": "no", "machine": "Some CPU, 2 CPUs", "seconds": 30}])
    text = readme_table.table(str(tmp_path))
    lines = text.splitlines()
    assert "Run on 2026-11-27 on commit abc1234, Some CPU, 2 CPUs" in lines[0]
    rows = [line for line in lines if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 1, rows  # training has a CSV but no run record; lists has no CSV
    assert "direct call 1.25 us, `dist.all_reduce` 4.90 us, gloo 1200 us" in rows[0]
    latency = next(w for k, w, *_ in readme_table.ROWS if k == "latency")
    assert f"- {latency}:\n  `{cmd}`" in text  # the row's command, named by the row, below the table
    assert "`python x`" not in text  # lists ran but has no CSV: no command either
    assert max(len(line) for line in lines) <= 200  # the README's limit


def test_rows_of_several_runs_are_named_with_their_run(tmp_path):
    write(tmp_path / "latency.csv", [
        {"path": "gloo", "bytes": 4096, "ranks": 2, "us_per_call": 1200.0},
        {"path": "fastpar direct", "bytes": 4096, "ranks": 2, "us_per_call": 1.25},
        {"path": "fastpar", "bytes": 4096, "ranks": 2, "us_per_call": 4.9}])
    shutil.copy(os.path.join(ROOT, "benchmarks", "results", "readme", "training.csv"), tmp_path)  # a real one
    run = {"command": "python x", "machine": "Some CPU, 2 CPUs", "seconds": 30}
    write(tmp_path / "runs.csv", [
        {"row": "latency", **run, "date_utc": "2026-11-27 18:00", "commit": "abc1234", "uncommitted_changes": "no"},
        {"row": "training", **run, "date_utc": "2026-11-28 09:00", "commit": "def5678", "uncommitted_changes": "yes"}])
    lines = readme_table.table(str(tmp_path)).splitlines()
    latency = next(w for k, w, *_ in readme_table.ROWS if k == "latency")
    training = next(w for k, w, *_ in readme_table.ROWS if k == "training")
    assert lines[0] == (f'The rows "{latency}": run on 2026-11-27 on commit abc1234, Some CPU, 2 CPUs; '
                        "baselines measured in the same runs."), lines[0]
    assert lines[1].startswith(f'The rows "{training}": run on 2026-11-28 on commit def5678 plus uncommitted'), lines[1]


def test_gpu_line_counts_the_summary(tmp_path):
    summary = tmp_path / "summary.txt"
    summary.write_text("date (UTC): 2026-11-26 14:13\nGPUs: 1 x Some GPU\n"
                       "a target   <= 1.3   1.74  MISSED\n"
                       "b target   >= 0.9   0.935  met\n"
                       "c target   <= 2   2.43  MISSED (3 of 4 rows)\n"
                       "d target   >= 0.9  not measured  -\n")
    line = readme_table.gpu_line(str(summary))
    assert "1 of 4 met, 2 missed, 1 not measured (d target)" in line, line
    assert "1 x Some GPU, 2026-11-26 14:13 UTC" in line
