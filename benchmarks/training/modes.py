"""Data-parallel LeNet training on local CPU processes, timed per mode.

Used by benchmarks/main_job.py and benchmarks/bench_training.py. Modes:

  fastpar_ddp     fastpar.DistributedDataParallel; backend "fastpar" when it is
                  registered, else gloo (the result says which)
  stock_ddp_gloo  torch.nn.parallel.DistributedDataParallel over gloo
  no_comm         the same processes and steps with no gradient exchange: the
                  throughput upper bound for any data-parallel scheme
  single          one process with one thread per rank it stands in for,
                  training on the whole global batch (run after the others,
                  in a process of its own)
  fastpar_ddp_gloo, stock_ddp_fastpar
                  the wrapper and the backend swapped, to tell their costs apart

Every mode trains its own LeNet from the same seed on the same global
batches (world_size * batch_per_rank samples per step), one thread per rank,
all in one set of processes and interleaved step by step, in an order that
rotates from one step to the next (see _worker).
Throughput counts the steps after ``warmup_steps``, each timed by its
slowest rank (see _combine): ``samples_per_s`` is the global batch over the
median of those step times (robust to load spikes from other processes on a
shared machine), ``wall_samples_per_s`` over their mean.

Paired ratios (paired_ratio, add_paired_ratios): the modes of one run take
their step i within a few tens of milliseconds of each other, so the ratio
of their step i times compares them under one machine state; the median of
these per-step ratios follows the modes' difference, not the machine's
speed drifting during the run (on a shared 2-core machine it moved 2x
between runs minutes apart).
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import queue as queue_mod
import statistics
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

MODES = {
    "fastpar_ddp": "fastpar DDP",
    "stock_ddp_gloo": "stock DDP (gloo)",
    "no_comm": "no communication",
    "single": "one process",
    # diagnostics: each wrapper on the other backend
    "fastpar_ddp_gloo": "fastpar DDP (gloo)",
    "stock_ddp_fastpar": "stock DDP (fastpar)",
}


# Numbers the sets of processes _spawn starts: a result's "run" says which
# modes took turns step by step with it (same run), which paired_ratio needs.
_RUN_IDS = itertools.count(1)


@dataclasses.dataclass
class Config:
    world: int = 2
    epochs: float = 1.0
    batch_per_rank: int = 64
    lr: float = 0.05
    warmup_steps: int = 5
    bucket_cap_mb: float = 25.0
    data_path: Optional[str] = None
    n_train: int = 12000
    n_test: int = 2000

    def steps(self) -> int:
        return max(self.warmup_steps + 1, int(self.epochs * self.n_train // (self.world * self.batch_per_rank)))


def _global_batches(n: int, steps: int, global_batch: int, seed: int = 0):
    """Index tensors of the global batch of each step: reshuffled every epoch, drop_last."""
    g = torch.Generator().manual_seed(seed)
    per_epoch = n // global_batch
    perm = None
    for step in range(steps):
        if step % per_epoch == 0:
            perm = torch.randperm(n, generator=g)
        i = step % per_epoch
        yield perm[i * global_batch: (i + 1) * global_batch]


def _build(mode: str, groups: Dict[str, Optional[dist.ProcessGroup]], cfg: Config):
    """The model (wrapped as the mode says) and its optimizer, from seed 0."""
    import fastpar
    from .lenet import lenet

    torch.manual_seed(0)
    net = lenet()
    if mode in ("fastpar_ddp", "fastpar_ddp_gloo"):
        group = groups["fastpar"] if mode == "fastpar_ddp" else groups["gloo"]
        model = fastpar.DistributedDataParallel(net, process_group=group, bucket_cap_mb=cfg.bucket_cap_mb)
    elif mode in ("stock_ddp_gloo", "stock_ddp_fastpar"):
        group = groups["fastpar"] if mode == "stock_ddp_fastpar" else groups["gloo"]
        model = torch.nn.parallel.DistributedDataParallel(net, process_group=group, bucket_cap_mb=cfg.bucket_cap_mb)
    else:
        model = net
    return net, model, torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)


def _worker(rank: int, world: int, modes: List[str], cfg: Config, data_file: str, store_path: str, q) -> None:
    """Every mode lives in these processes; each step runs every mode once, each
    mode's step starting from a barrier, so load from other processes on the
    machine falls on all modes alike (separate runs differed by 2x on our
    shared 2-core machine)."""
    from .lenet import accuracy

    # one thread per rank; "single" runs alone in its own process with one thread per rank it stands in for
    torch.set_num_threads(cfg.world if modes == ["single"] else 1)
    data = torch.load(data_file)
    x, y = data["train"]
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    import fastpar  # noqa: F401  (registers the "fastpar" backend)

    groups: Dict[str, Optional[dist.ProcessGroup]] = {"gloo": None, "fastpar": dist.new_group(backend="fastpar")}
    backends = {m: ("-" if m == "single" else "gloo" if m == "no_comm" else
                    "fastpar" if m in ("fastpar_ddp", "stock_ddp_fastpar") else "gloo")
                for m in modes}
    built = {m: _build(m, groups, cfg) for m in modes}
    steps = cfg.steps()
    global_batch = cfg.world * cfg.batch_per_rank
    times: Dict[str, List[float]] = {m: [] for m in modes}
    for step, idx in enumerate(_global_batches(len(y), steps, global_batch)):
        mine = idx[rank * cfg.batch_per_rank: (rank + 1) * cfg.batch_per_rank]
        # each mode goes first as often as the others: whatever the first step
        # after the barrier gains or loses falls on all modes alike
        first = step % len(modes)
        for mode in modes[first:] + modes[:first]:
            dist.barrier()
            net, model, opt = built[mode]
            batch = idx if mode == "single" else mine
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[batch]), y[batch]).backward()
            opt.step()
            if step >= cfg.warmup_steps:
                times[mode].append(time.perf_counter() - start)
        if rank == 0 and (step % 5 == 0 or step == steps - 1):
            q.put(("progress", step + 1, steps))
    for mode in modes:
        net = built[mode][0]
        q.put(("result", rank, {
            "mode": mode, "label": MODES[mode], "backend": backends[mode],
            "world": 1 if mode == "single" else world, "steps": len(times[mode]), "global_batch": global_batch,
            "seconds": sum(times[mode]), "step_times": times[mode],
            "accuracy": accuracy(net, *data["test"]) if rank == 0 else None,
            "bucket_storage": getattr(built[mode][1], "bucket_storage_kind", "-"),
        }))
    dist.barrier()
    dist.destroy_process_group()


def prepare_data(cfg: Config, folder: str) -> tuple:
    """Loads (or synthesizes) the data once and saves it for the workers; returns (file, description)."""
    from .datasets import load_data
    data = load_data(cfg.data_path, cfg.n_train, cfg.n_test)
    cfg.n_train = len(data.train.labels)
    path = os.path.join(folder, "data.pt")
    torch.save({"train": tuple(data.train), "test": tuple(data.test)}, path)
    return path, data.description


def run_modes(modes: Sequence[str], cfg: Config, data_file: str,
              on_progress: Optional[Callable[[int, int], None]] = None, timeout_s: float = 1800) -> List[Dict]:
    """Trains the multi-process modes in one set of cfg.world fresh processes,
    interleaved step by step, then "single" (if asked) in a process of its own;
    returns one result per mode, in the order given."""
    for m in modes:
        if m not in MODES:
            raise ValueError(f"fastpar.training_benchmark: mode is {m!r}; it must be one of {list(MODES)}")
    together = [m for m in modes if m != "single"]
    results: Dict[str, Dict] = {}
    if together:
        results.update(_spawn(together, cfg.world, cfg, data_file, on_progress, timeout_s))
    if "single" in modes:
        results.update(_spawn(["single"], 1, cfg, data_file, on_progress, timeout_s))
    return [results[m] for m in modes]


def _spawn(modes: List[str], world: int, cfg: Config, data_file: str,
           on_progress: Optional[Callable[[int, int], None]], timeout_s: float) -> Dict[str, Dict]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    store = os.path.join(tempfile.mkdtemp(prefix="fastpar_train_"), "store")
    procs = [ctx.Process(target=_worker, args=(r, world, modes, cfg, data_file, store, q), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    per_mode: Dict[str, Dict[int, Dict]] = {m: {} for m in modes}
    expected, received, deadline = world * len(modes), 0, time.time() + timeout_s
    try:
        while received < expected:
            try:
                kind, *payload = q.get(timeout=0.5)
            except queue_mod.Empty:
                failed = [p for p in procs if p.exitcode not in (None, 0)]
                if failed:
                    raise RuntimeError(f"fastpar.training_benchmark: a worker exited with code {failed[0].exitcode}")
                if time.time() > deadline:
                    raise TimeoutError(f"fastpar.training_benchmark: the run went past {timeout_s} s")
                continue
            if kind == "progress" and on_progress:
                on_progress(*payload)
            elif kind == "result":
                rank, res = payload
                per_mode[res["mode"]][rank] = res
                received += 1
        for p in procs:
            p.join(timeout=60)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
    run = next(_RUN_IDS)
    return {m: dict(_combine(per_mode[m]), run=run) for m in modes}


def _combine(per_rank: Dict[int, Dict]) -> Dict:
    """Rank 0's result, timed by the slowest rank of each step. Steps start from
    a barrier, so step i of every rank covers the same moment; a synchronous
    data-parallel step can finish no sooner than its slowest rank, which makes
    this the right bound for no_comm too (its ranks would otherwise never wait
    for a rank that other processes on the machine have slowed down)."""
    out = {k: v for k, v in per_rank[0].items() if k != "step_times"}
    steps = zip(*(r["step_times"] for r in per_rank.values()))
    slowest = [max(ts) for ts in steps]
    out["slowest_step_s"] = slowest  # for paired_ratio; not a CSV column (see csv_row)
    out["seconds"] = sum(slowest)
    out["median_step_s"] = statistics.median(slowest)
    out["wall_samples_per_s"] = len(slowest) * out["global_batch"] / out["seconds"]
    out["samples_per_s"] = out["global_batch"] / out["median_step_s"]
    return out


def paired_ratio(row: Dict, baseline: Dict) -> float:
    """How many times faster ``row``'s mode stepped than ``baseline``'s, paired
    step by step: the median over the timed steps of baseline step i / row
    step i (each the slowest rank's time). Both must come from one run_modes
    call, whose modes take their step i one after another."""
    a, b = row.get("slowest_step_s"), baseline.get("slowest_step_s")
    if a is None or b is None or len(a) != len(b) or row.get("run") != baseline.get("run"):
        raise ValueError(f"paired_ratio: modes {row['mode']!r} and {baseline['mode']!r} were not timed step by "
                         f"step in one run; pair only modes of one run_modes call")
    return statistics.median(tb / ta for ta, tb in zip(a, b))


def add_paired_ratios(rows: List[Dict], baseline_mode: str) -> None:
    """Sets ``vs_<baseline_mode>_paired`` (paired_ratio) on every row of the
    baseline's run; rows of other runs (one process) get None."""
    base = next(r for r in rows if r["mode"] == baseline_mode)
    for r in rows:
        paired = r.get("run") == base.get("run") and "slowest_step_s" in r
        r[f"vs_{baseline_mode}_paired"] = paired_ratio(r, base) if paired else None


def csv_row(row: Dict) -> Dict:
    """A result as one CSV row: everything but the per-step times."""
    return {k: v for k, v in row.items() if k != "slowest_step_s"}


def format_table(rows: List[Dict], baseline_mode: str, paired_baseline: Optional[str] = None) -> str:
    """One line per mode: samples/s, its ratio to ``baseline_mode``'s samples/s
    and, with ``paired_baseline``, the paired ratio to that mode
    (``vs_<paired_baseline>_paired``, add_paired_ratios; '-' for a mode timed in
    another run)."""
    base = next((r for r in rows if r["mode"] == baseline_mode), None)
    pcol = f"vs_{paired_baseline}_paired" if paired_baseline else None
    head = f"{'mode':<20} {'backend':<8} {'procs':>5} {'samples/s':>10} {'(wall)':>8} {'vs ' + baseline_mode:>16}"
    if pcol:
        head += f" {'vs ' + paired_baseline + ', paired':>26}"
    head += f" {'test acc':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        line = (f"{r['label']:<20} {r['backend']:<8} {r['world']:>5} {r['samples_per_s']:>10.0f} "
                f"{r['wall_samples_per_s']:>8.0f} "
                f"{r['samples_per_s'] / base['samples_per_s']:>15.3f}x")
        if pcol:
            line += f" {r[pcol]:>25.3f}x" if r.get(pcol) is not None else f" {'-':>26}"
        line += f" {100 * r['accuracy']:>8.2f}%"
        lines.append(line)
    return "\n".join(lines)
