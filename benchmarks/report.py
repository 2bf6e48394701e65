"""Shared output for the benchmarks: an aligned table on stdout, CSV, and a PNG
plot when matplotlib is importable (the plot is skipped with a message if not)."""
from __future__ import annotations

import csv
import os
import sys
import time
from typing import Callable, Dict, List, Sequence


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def print_table(rows: List[Dict], columns: Sequence[str], title: str = "") -> None:
    if title:
        print(f"\n{title}")
    cells = [[_fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))
    sys.stdout.flush()


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def write_csv(rows: List[Dict], path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    keys: List[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")


def plot_lines(series: Dict[str, List], path: str, xlabel: str, ylabel: str, title: str) -> bool:
    """series: label -> [(x, y), ...]; log-log axes (sizes and bandwidths span decades)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no plot written ({path}); pip install matplotlib")
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, pts in series.items():
        pts = sorted(p for p in pts if p[1] > 0)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")
    return True


def time_it(fn: Callable[[], None], min_time: float = 0.2, reps: int = 7, sync: Callable[[], None] = lambda: None) -> float:
    """Best-of-`reps` seconds per call: each sample runs enough calls to last
    about min_time / reps, after a warm-up call (first-touch, thread start).
    The minimum, not the median: our machines are VMs whose neighbours steal
    cycles in bursts, and every column of a table is timed the same way."""
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - t0, 1e-7)
    calls = max(1, int(min_time / reps / one))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / calls)
    return min(samples)


class Progress:
    """A one-line progress bar on stderr for long sweeps."""

    def __init__(self, total: int, label: str):
        self.total, self.label, self.done, self.t0 = max(total, 1), label, 0, time.time()

    def step(self, what: str = "") -> None:
        self.done += 1
        frac = self.done / self.total
        bar = "#" * int(30 * frac)
        sys.stderr.write(f"\r{self.label} [{bar:<30}] {self.done}/{self.total} {time.time() - self.t0:5.1f}s {what:<24}")
        if self.done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()
