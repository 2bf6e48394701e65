"""Data-parallel LeNet training on local CPU processes, timed per mode.

Used by ``python -m fastpar.main`` and benchmarks/bench_training.py. Modes:

  fastpar_ddp     fastpar.DistributedDataParallel; backend "fastpar" when it is
                  registered, else gloo (the result says which)
  stock_ddp_gloo  torch.nn.parallel.DistributedDataParallel over gloo
  no_comm         the same processes and steps with no gradient exchange: the
                  throughput upper bound for any data-parallel scheme
  single          one process (with as many threads as the others have
                  processes) training on the whole global batch
  fastpar_ddp_gloo, stock_ddp_fastpar
                  the wrapper and the backend swapped, to tell their costs apart

Every mode trains the same LeNet from the same seed on the same global
batches (world_size * batch_per_rank samples per step), one thread per rank.
Throughput counts the steps after ``warmup_steps``: ``samples_per_s`` is the
global batch over the slowest rank's median step time (robust to load spikes
from other processes on a shared machine), ``wall_samples_per_s`` the same
steps timed from a barrier to a barrier.
"""
from __future__ import annotations

import dataclasses
import os
import queue as queue_mod
import statistics
import tempfile
import time
from typing import Callable, Dict, List, Optional

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


def fastpar_backend_available() -> bool:
    import fastpar  # noqa: F401  (registers the backend when it is built)
    try:
        import fastpar.distributed  # noqa: F401
    except ImportError:
        pass
    return "fastpar" in [str(b).lower() for b in dist.Backend.backend_list]


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


def _worker(rank: int, world: int, mode: str, cfg: Config, data_file: str, store_path: str, q) -> None:
    import fastpar
    from fastpar.lenet import accuracy, lenet

    torch.set_num_threads(world if mode == "single" else 1)
    data = torch.load(data_file)
    x, y = data["train"]
    backend = None
    if mode != "single":
        wants_fastpar = mode in ("fastpar_ddp", "stock_ddp_fastpar")
        if mode == "stock_ddp_fastpar" and not fastpar_backend_available():
            raise RuntimeError("fastpar.training_benchmark: mode stock_ddp_fastpar needs the fastpar backend")
        backend = "fastpar" if wants_fastpar and fastpar_backend_available() else "gloo"
        dist.init_process_group(backend, store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    torch.manual_seed(0)
    net = lenet()
    if mode in ("fastpar_ddp", "fastpar_ddp_gloo"):
        model = fastpar.DistributedDataParallel(net, bucket_cap_mb=cfg.bucket_cap_mb)
    elif mode in ("stock_ddp_gloo", "stock_ddp_fastpar"):
        model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=cfg.bucket_cap_mb)
    else:
        model = net
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    steps = cfg.steps()
    global_batch = world * cfg.batch_per_rank if mode != "single" else cfg.world * cfg.batch_per_rank
    t0, step_times = None, []
    for step, idx in enumerate(_global_batches(len(y), steps, global_batch)):
        if step == cfg.warmup_steps:
            if backend:
                dist.barrier()
            t0 = time.perf_counter()
        start = time.perf_counter()
        mine = idx if mode == "single" else idx[rank * cfg.batch_per_rank: (rank + 1) * cfg.batch_per_rank]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[mine]), y[mine]).backward()
        opt.step()
        if step >= cfg.warmup_steps:
            step_times.append(time.perf_counter() - start)
        if rank == 0 and (step % 10 == 0 or step == steps - 1):
            q.put(("progress", step + 1, steps))
    if backend:
        dist.barrier()
    elapsed = time.perf_counter() - t0
    q.put(("result", rank, {
        "mode": mode, "label": MODES[mode], "backend": backend or "-", "world": 1 if mode == "single" else world,
        "steps": len(step_times), "global_batch": global_batch, "seconds": elapsed,
        "median_step_s": statistics.median(step_times),
        "accuracy": accuracy(net, *data["test"]) if rank == 0 else None,
        "bucket_storage": getattr(model, "bucket_storage_kind", "-"),
    }))
    if backend:
        dist.destroy_process_group()


def prepare_data(cfg: Config, folder: str) -> tuple:
    """Loads (or synthesizes) the data once and saves it for the workers; returns (file, description)."""
    from .datasets import load_data
    data = load_data(cfg.data_path, cfg.n_train, cfg.n_test)
    cfg.n_train = len(data.train.labels)
    path = os.path.join(folder, "data.pt")
    torch.save({"train": tuple(data.train), "test": tuple(data.test)}, path)
    return path, data.description


def run_mode(mode: str, cfg: Config, data_file: str,
             on_progress: Optional[Callable[[int, int], None]] = None, timeout_s: float = 1800) -> Dict:
    """Trains in fresh processes (world of them; 1 for "single") and returns rank 0's result."""
    if mode not in MODES:
        raise ValueError(f"fastpar.training_benchmark: mode is {mode!r}; it must be one of {list(MODES)}")
    world = 1 if mode == "single" else cfg.world
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    folder = tempfile.mkdtemp(prefix="fastpar_train_")
    store = os.path.join(folder, "store")
    procs = [ctx.Process(target=_worker, args=(r, world, mode, cfg, data_file, store, q), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    per_rank: Dict[int, Dict] = {}
    deadline = time.time() + timeout_s
    try:
        while len(per_rank) < world:
            try:
                kind, *payload = q.get(timeout=0.5)
            except queue_mod.Empty:
                failed = [p for p in procs if p.exitcode not in (None, 0)]
                if failed:
                    raise RuntimeError(f"fastpar.training_benchmark: mode {mode}: a worker exited with code "
                                       f"{failed[0].exitcode}")
                if time.time() > deadline:
                    raise TimeoutError(f"fastpar.training_benchmark: mode {mode} ran past {timeout_s} s")
                continue
            if kind == "progress" and on_progress:
                on_progress(*payload)
            elif kind == "result":
                per_rank[payload[0]] = payload[1]
        for p in procs:
            p.join(timeout=60)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
    return _combine(per_rank)


def _combine(per_rank: Dict[int, Dict]) -> Dict:
    """Rank 0's result, timed by the slowest rank: wall time from barrier to
    barrier, and the median step (robust to load spikes from other processes
    on a shared machine, which only ever add time)."""
    out = dict(per_rank[0])
    out["seconds"] = max(r["seconds"] for r in per_rank.values())
    out["median_step_s"] = max(r["median_step_s"] for r in per_rank.values())
    out["wall_samples_per_s"] = out["steps"] * out["global_batch"] / out["seconds"]
    out["samples_per_s"] = out["global_batch"] / out["median_step_s"]
    return out


def format_table(rows: List[Dict], baseline_mode: str, extra_baseline: Optional[str] = None) -> str:
    base = next((r for r in rows if r["mode"] == baseline_mode), None)
    other = next((r for r in rows if r["mode"] == extra_baseline), None) if extra_baseline else None
    head = f"{'mode':<20} {'backend':<8} {'procs':>5} {'samples/s':>10} {'(wall)':>8} {'vs ' + baseline_mode:>16}"
    if other:
        head += f" {'vs ' + extra_baseline:>18}"
    head += f" {'test acc':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        line = (f"{r['label']:<20} {r['backend']:<8} {r['world']:>5} {r['samples_per_s']:>10.0f} "
                f"{r['wall_samples_per_s']:>8.0f} "
                f"{r['samples_per_s'] / base['samples_per_s']:>15.3f}x")
        if other:
            line += f" {r['samples_per_s'] / other['samples_per_s']:>17.3f}x"
        line += f" {100 * r['accuracy']:>8.2f}%"
        lines.append(line)
    return "\n".join(lines)
