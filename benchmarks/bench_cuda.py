"""GPU benchmarks (run by scripts/gpu_check.sh): every figure beside a
baseline measured in the same run, and the targets beside the
figures (gpu_summary.py holds the rows, targets, tables, CSV and plots).

  lists  fastpar.allreduce([t0, ..., tk-1]), direct and ring, k = 2, 4, 8,
         float32 and bfloat16, 4 KiB .. 256 MiB per tensor, all on cuda:0
         (and on k distinct GPUs when there are k); baseline
         torch.stack(ts).sum(0) + a copy into each (one GPU) or
         torch.cuda.nccl.all_reduce (distinct GPUs); ceiling: one
         device-to-device copy of the same 2*k*size bytes. CUDA events.
  host   host time per call at 4 KiB: k = 2 and 8, N calls, one synchronize
  ipc    dist.all_reduce on a "fastpar" group, 2, 3 and 4 ranks as
         processes sharing cuda:0 (start an MPS daemon first, or they
         time-slice), and on distinct GPUs beside an NCCL group when there
         are enough; with 2 ranks, up to 256 KiB also captured in a CUDA graph
         (one all_reduce per replay) and as fastpar.distributed.all_reduce
         (no torch wrapper), above it also on registered tensors
         (registered_empty: no copy-in) and with two-shot above 256 KiB (the
         schedule 2 ranks ran before). Each run's rank 0 also measures the
         targets' units in its own process (gpu_summary.ref_row): one kernel
         launch from Python and a device-to-device copy's rate.

  python benchmarks/bench_cuda.py                      # all parts, ~3 minutes on one H100
  python benchmarks/bench_cuda.py --part lists --quick
  python benchmarks/bench_cuda.py --dry-run --out /tmp/x  # synthetic rows: table, CSV, plots; no CUDA
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
import traceback

_STARTED = time.monotonic()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_summary as gs  # noqa: E402
from launch import run_ranks  # noqa: E402

KiB, MiB = gs.KiB, gs.MiB
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ("check", "lists", "host", "ipc")


def sizes(lo: int, hi: int, step: int) -> list:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= step
    return out


def event_time(fn, target_s: float = 0.02, reps: int = 5, agree=None) -> float:
    """Seconds per call on the current stream: median of `reps` runs of
    enough calls to last about target_s, timed with CUDA events. `agree`
    maps this process's call count to the one every rank uses (collectives:
    each rank's estimate differs, and a rank making fewer calls would leave
    its peers waiting for calls that never come)."""
    import torch

    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    iters = max(1, min(500, int(target_s / max(start.elapsed_time(end) / 1e3, 1e-6))))
    if agree is not None:
        iters = agree(iters)
    samples = []
    for _ in range(reps):
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / iters)
    return statistics.median(samples)


def wall_time(fn, devices, target_s: float = 0.02, reps: int = 5) -> float:
    """Seconds per call across several devices: host clock around calls,
    synchronizing every device (events on one stream would miss the others)."""
    import torch

    def sync():
        for d in devices:
            torch.cuda.synchronize(d)
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    iters = max(1, min(500, int(target_s / max(time.perf_counter() - t0, 1e-6))))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / iters)
    return statistics.median(samples)


def host_time(fn, calls: int) -> float:
    """Host seconds per call: `calls` calls, then one synchronize (the GPU's
    work overlaps the loop; a call that launches faster than the GPU runs it
    is bounded by the GPU)."""
    import torch

    for _ in range(max(10, calls // 10)):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def list_rows(args) -> list:
    import torch

    import fastpar

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    ngpu = torch.cuda.device_count()
    rows = []
    for k in args.ks:
        placements = [(gs.ONE_GPU, ["cuda:0"] * k)]
        if ngpu >= k:
            placements.append((f"{k} GPUs", [f"cuda:{i}" for i in range(k)]))
        for placement, devs in placements:
            for dname in args.dtypes:
                dtype = dtypes[dname]
                for size in args.sizes:
                    if time.time() > args.stop_at:
                        rows.append(gs.list_row(placement, k, dname, "direct", size, None, "", None, None,
                                                "not measured: --time-limit reached"))
                        break
                    numel = size // torch.tensor([], dtype=dtype).element_size()
                    try:
                        ts = [torch.randn(numel, device=d).to(dtype) for d in devs]
                    except torch.cuda.OutOfMemoryError as e:
                        rows.append(gs.list_row(placement, k, dname, "direct", size, None, "", None, None, _err(e)))
                        continue
                    one = placement == gs.ONE_GPU
                    if one:
                        flat_src = torch.empty(k * numel, dtype=dtype, device="cuda:0")
                        flat_dst = torch.empty_like(flat_src)
                        t_copy = event_time(lambda: flat_dst.copy_(flat_src))

                        def baseline():
                            r = torch.stack(ts).sum(0)
                            for t in ts:
                                t.copy_(r)
                        t_base, base_name = event_time(baseline), "torch stack+sum+copies"
                        del flat_src, flat_dst
                    else:
                        import torch.cuda.nccl as nccl

                        t_copy, base_name = None, "torch.cuda.nccl"
                        t_base = wall_time(lambda: nccl.all_reduce(ts), range(k))
                    for alg in args.algorithms:
                        try:
                            fn = (lambda: fastpar.allreduce(ts, algorithm=alg))
                            t = event_time(fn) if one else wall_time(fn, range(k))
                            rows.append(gs.list_row(placement, k, dname, alg, size, t, base_name, t_base, t_copy))
                        except Exception as e:  # a refused placement must not end the sweep
                            rows.append(gs.list_row(placement, k, dname, alg, size, None, base_name, t_base,
                                                    t_copy, _err(e)))
                    del ts
                    torch.cuda.empty_cache()
                print(f"lists: {placement} k={k} {dname} done", file=sys.stderr, flush=True)
    return rows


def host_rows(args) -> list:
    import torch

    import fastpar

    rows = []
    x = torch.zeros(1024, device="cuda:0")
    y = torch.zeros(1024, device="cuda:0")

    def measure(call, k, fn):
        try:
            rows.append(gs.host_row(call, k, host_time(fn, args.host_calls)))
        except Exception as e:
            rows.append(gs.host_row(call, k, None, _err(e)))

    measure("torch add_ (one launch)", 1, lambda: x.add_(y))
    measure("one tensor (checks only)", 1, lambda: fastpar.allreduce([x]))
    for k in (2, 8):
        ts = [torch.zeros(1024, device="cuda:0") for _ in range(k)]
        for alg in ("direct", "ring"):
            measure(alg, k, lambda: fastpar.allreduce(ts, algorithm=alg))
        # the op's own entry, without fastpar.allreduce's Python side: the
        # difference is what the argument checks and op lookup cost
        measure("direct, op entry (no Python checks)", k, lambda: fastpar._C._allreduce_(ts, 0, "direct"))

        def baseline():
            r = torch.stack(ts).sum(0)
            for t in ts:
                t.copy_(r)
        measure("torch stack+sum+copies", k, baseline)
    return rows


def ref_rows(placement: str, ranks: int, host_calls: int) -> list:
    """The targets' units, in this process: one launch from Python (x.add_(y),
    4 KiB, host time per call) and a 64 MiB device-to-device copy's rate
    (read + write bytes per second)."""
    import torch

    x, y = torch.zeros(1024, device="cuda"), torch.zeros(1024, device="cuda")
    src = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t_copy = event_time(lambda: dst.copy_(src))
    return [gs.ref_row("launch_us", placement, ranks, host_time(lambda: x.add_(y), host_calls) * 1e6),
            gs.ref_row("copy_GBps", placement, ranks, 2 * src.numel() / t_copy / 1e9)]


def ipc_worker(args) -> None:
    """One rank: dist.all_reduce on a fastpar group (and an NCCL group on
    distinct GPUs); rank 0 writes its rows (the slowest rank's times) as JSON."""
    import torch
    import torch.distributed as dist

    import fastpar  # registers "fastpar"; fastpar._C._testing
    import fastpar.distributed as fd

    rank, n = args.rank, args.ranks[0]
    ngpu = torch.cuda.device_count()
    placement = "shared cuda:0" if args.placement == "shared" else "distinct GPUs"
    torch.cuda.set_device(0 if args.placement == "shared" else rank % ngpu)
    rows = []
    store = dist.TCPStore("127.0.0.1", args.port, n, rank == 0, timeout=datetime.timedelta(seconds=60),
                          wait_for_workers=False)
    dist.init_process_group("fastpar", store=store, rank=rank, world_size=n, timeout=datetime.timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    groups = [("fastpar", None)]
    if args.placement == "distinct":
        groups.append(("nccl", dist.new_group(backend="nccl")))

    def keep(row: dict) -> None:
        """Rank 0 rewrites the file after every row: a hang later (a peer
        stuck after a failure) and the kill that ends it lose nothing."""
        rows.append(row)
        if rank == 0:
            write_rows(rows, args.ipc_out)

    def over_gloo(value, op):
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=op, group=gloo)
        return t.item()

    def slowest(sec: float) -> float:
        return over_gloo(sec, dist.ReduceOp.MAX)

    def agreed_calls(k: int) -> int:
        return int(over_gloo(k, dist.ReduceOp.MIN))

    # The units first, while the other ranks wait (a launch's host time and a
    # copy's rate are what this process sees, on a GPU shared with them).
    if rank == 0:
        for row in ref_rows(placement, n, args.host_calls):
            keep(row)
    dist.barrier(group=gloo)

    def series(name: str, sizes_: list, measure) -> None:
        """measure(size) -> (seconds, host seconds) for each size, the ranks
        in step: a failure on any rank (its exception, or a peer's) ends the
        series on every rank, which then go on to the next one together; so
        does the run's time limit (--stop-at), the sizes left then marked."""
        for i, size in enumerate(sizes_):
            if over_gloo(1.0 if time.time() < args.stop_at else 0.0, dist.ReduceOp.MIN) == 0.0:
                for s in sizes_[i:]:
                    keep(gs.ipc_row(name, placement, n, s, None, None, "not measured: time limit"))
                return
            err, sec, host = None, None, None
            try:
                sec, host = measure(size)
            except Exception as e:  # e.g. a refused shared GPU: report it, keep the others
                err = _err(e)
                if rank == 0:
                    traceback.print_exc()
            if over_gloo(0.0 if err else 1.0, dist.ReduceOp.MIN) == 0.0:
                keep(gs.ipc_row(name, placement, n, size, None, None, err or "failed on another rank"))
                return
            keep(gs.ipc_row(name, placement, n, size, sec, host))

    def plain(group, size):
        t = torch.ones(size // 4, device="cuda")
        host = None
        if size <= 256 * KiB:
            dist.barrier(group=gloo)
            host = slowest(host_time(lambda: dist.all_reduce(t, group=group), args.host_calls))
        dist.barrier(group=gloo)
        return slowest(event_time(lambda: dist.all_reduce(t, group=group), reps=3, agree=agreed_calls)), host

    def with_engine(knob: str, value: str, restore: str, measure_):
        """`measure_` with the CUDA engine's FASTPAR_CUDA_IPC_`knob` at `value`
        (the test hook, fastpar._C._testing.cuda_override), then back at
        `restore` (what the other rows run): the old and the new form of a
        call, or another choice, in the same run."""
        def measure(size):
            engine = fd.get_fastpar_backend().cuda_engine
            override = fastpar._C._testing.cuda_override
            override(engine, "FASTPAR_CUDA_IPC_" + knob, str(value))
            try:
                return measure_(size)
            finally:
                override(engine, "FASTPAR_CUDA_IPC_" + knob, str(restore))
        return measure

    def fastpar_plain(size):
        return plain(None, size)

    def group_with(env: dict):
        """A new fastpar group whose CUDA engine reads `env` (knobs are read
        when a group is created), the process's environment left as it was."""
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            return dist.new_group(backend="fastpar")
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k)
                else:
                    os.environ[k] = v

    def busy_rank(form: str):
        """Rank 0's time for ~20 ms of matrix products (CUDA events) while the
        other ranks wait in an all_reduce of `size` it joins afterwards, the
        two-shot in `form` ("alone": no call waits; every rank synchronizes
        before rank 0 starts)."""
        a = torch.randn(2048, 2048, device="cuda")
        per = event_time(lambda: torch.mm(a, a), reps=3)
        products = max(1, int(0.02 / per))

        def measure(size):
            engine = fd.get_fastpar_backend().cuda_engine
            override = fastpar._C._testing.cuda_override
            if form != "alone":
                override(engine, "FASTPAR_CUDA_IPC_TWO_SHOT", form)
            t = torch.ones(size // 4, device="cuda")
            times = []
            try:
                for _ in range(3):
                    dist.barrier(group=gloo)
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    if rank == 0 or form == "alone":
                        start.record()
                        if rank == 0:
                            for _ in range(products):
                                torch.mm(a, a)
                        end.record()
                    if form != "alone":
                        dist.all_reduce(t)
                    if rank == 0 or form == "alone":
                        end.synchronize()
                        times.append(start.elapsed_time(end) / 1e3)
                    torch.cuda.synchronize()
            finally:
                override(engine, "FASTPAR_CUDA_IPC_TWO_SHOT", "fused")
            return slowest(statistics.median(times) if rank == 0 else 0.0), None
        return measure

    def registered(size):
        t = fd.registered_empty((size // 4,), torch.float32, device="cuda").fill_(1)
        dist.barrier(group=gloo)
        return slowest(event_time(lambda: dist.all_reduce(t), reps=3, agree=agreed_calls)), None

    def graphed(size):
        t = torch.ones(size // 4, device="cuda")
        dist.all_reduce(t)  # IPC is set up outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            dist.all_reduce(t)
        dist.barrier(group=gloo)
        host = slowest(host_time(graph.replay, args.host_calls))
        dist.barrier(group=gloo)
        return slowest(event_time(graph.replay, reps=3, agree=agreed_calls)), host

    def direct(size):
        """fastpar.distributed.all_reduce: the same call without torch's Python
        wrapper, dispatcher and Work, so the host time splits into torch's
        share and fastpar's."""
        t = torch.ones(size // 4, device="cuda")
        dist.barrier(group=gloo)
        host = slowest(host_time(lambda: fd.all_reduce(t), args.host_calls))
        dist.barrier(group=gloo)
        return slowest(event_time(lambda: fd.all_reduce(t), reps=3, agree=agreed_calls)), host

    def fake_backend(size):
        """dist.all_reduce on a group of torch's "fake" backend, which does
        nothing: torch's own host cost per call (Python wrapper, dispatcher,
        Work), the part of the "fastpar" rows' host time that is not fastpar's."""
        import torch.testing._internal.distributed.fake_pg  # noqa: F401  registers "fake"

        fake = dist.new_group(backend="fake")
        t = torch.ones(size // 4, device="cuda")
        dist.barrier(group=gloo)
        return None, slowest(host_time(lambda: dist.all_reduce(t, group=fake), args.host_calls))

    def collective(op: str):
        """broadcast, all_gather_into_tensor or reduce_scatter_tensor, N bytes per rank."""
        def measure(size):
            t = torch.ones(size // 4, device="cuda")
            if op == "broadcast":
                call = lambda: dist.broadcast(t, 0)  # noqa: E731
            elif op == "all_gather":
                out = torch.empty(n * t.numel(), device="cuda")
                call = lambda: dist.all_gather_into_tensor(out, t)  # noqa: E731
            else:
                whole = torch.ones(n * t.numel(), device="cuda")
                call = lambda: dist.reduce_scatter_tensor(t, whole)  # noqa: E731
            dist.barrier(group=gloo)
            return slowest(event_time(call, reps=3, agree=agreed_calls)), None
        return measure

    # The "fastpar" rows run the fused two-shot (one kernel a call), whatever
    # the default: the new schedule is measured against the old in this run.
    fastpar._C._testing.cuda_override(fd.get_fastpar_backend().cuda_engine, "FASTPAR_CUDA_IPC_TWO_SHOT", "fused")

    for name, group in groups:
        series(name, args.ipc_sizes, lambda size: plain(group, size))
    # the sizes that run two-shot (above the one-shot limit), in its other form
    one_shot_hi = fd.get_fastpar_backend().cuda_engine.one_shot_max_bytes
    # The step-by-step two-shot (2mn + 1 stream operations a call) beside the
    # fused kernel (one) that the "fastpar" rows run.
    series("fastpar two-shot steps", [s for s in args.ipc_sizes if s > one_shot_hi],
           with_engine("TWO_SHOT", "steps", "fused", fastpar_plain))
    # The schedule the plain rows did not run, from 256 KiB to 2 MiB: the
    # one-shot limit per rank count (FASTPAR_CUDA_IPC_ONE_SHOT_MAX_BYTES) is
    # read off the two in gpu_summary.py.
    if rank == 0:
        keep(gs.ref_row("one_shot_max_bytes", placement, n, one_shot_hi))
    slot = int(os.environ.get("FASTPAR_CUDA_IPC_SLOT_BYTES", 8 * MiB))
    if n > 2:
        series("fastpar two-shot forced", [s for s in args.ipc_sizes if 256 * KiB <= s <= one_shot_hi],
               with_engine("ONE_SHOT_MAX_BYTES", 0, "", fastpar_plain))
        series("fastpar one-shot forced", [s for s in args.ipc_sizes if one_shot_hi < s <= min(2 * MiB, slot)],
               with_engine("ONE_SHOT_MAX_BYTES", slot, "", fastpar_plain))
    if n == 2:  # 3 and 4 ranks are measured against 2 on the plain all_reduce only (the time it takes)
        series("fastpar direct", [s for s in args.ipc_sizes if s <= 256 * KiB], direct)
        series("torch fake backend", [s for s in args.ipc_sizes if s == 4 * KiB], fake_backend)
        # the sizes 2 ranks now run one-shot and ran two-shot before
        hi = fd.get_fastpar_backend().cuda_engine.one_shot_max_bytes
        series("fastpar two-shot above 256 KiB", [s for s in args.ipc_sizes if 256 * KiB < s <= hi],
               with_engine("ONE_SHOT_MAX_BYTES", 256 * KiB, "", fastpar_plain))
        # The same all_reduce on registered tensors (registered_empty: no
        # copy-in); the registered two-shot runs above the one-shot sizes.
        series("fastpar registered", [s for s in args.ipc_sizes if s > 256 * KiB], registered)
        # ... step by step (m(n + 1) + 2 stream operations, (3n - 1)N bytes)
        # beside the push (one kernel, 2nN bytes) of the rows above.
        series("fastpar registered steps", [s for s in args.ipc_sizes if s > 256 * KiB],
               with_engine("TWO_SHOT", "steps", "fused", registered))
        # The other collectives, one kernel a call ("fused") against a copy
        # kernel per peer region and a phase kernel per slot-sized piece.
        for op in ("broadcast", "all_gather", "reduce_scatter"):
            for form in ("fused", "steps"):
                series(f"fastpar {op} {form}", [s for s in args.ipc_sizes if s >= MiB],
                       with_engine("COLLECTIVES", form, "steps", collective(op)))
        # The same all_reduce captured in a CUDA graph (fastpar's graphed kernel):
        # one all_reduce per graph, so host time per replay is per call.
        series("fastpar graph", [s for s in args.ipc_sizes if s <= 256 * KiB], graphed)
        # (c) The one-kernel calls' block barriers (FASTPAR_CUDA_IPC_FLAGS, the
        # test hook only): "peer", each waiter polls the arriving rank's flag
        # (every poll an acquire load of that rank's memory: over NVLink or
        # PCIe on distinct GPUs), against "waiter", each rank writes its
        # arrival into every waiter's memory, which the waiter polls. The same
        # call in each form, one right after the other at each size: the fused
        # one-shot (4 KiB, 256 KiB), the fused two-shot (8 MiB: a barrier per
        # block and chunk) and a graph replay (4 KiB). The form that loses goes
        # (gpu_summary.decisions).
        for size in [s for s in args.ipc_sizes if s in (4 * KiB, 256 * KiB, 8 * MiB)]:
            for form in ("peer", "waiter"):
                series(f"fastpar flags {form}", [size], with_engine("FLAGS", form, "", fastpar_plain))
        for form in ("peer", "waiter"):
            series(f"fastpar graph flags {form}", [s for s in args.ipc_sizes if s == 4 * KiB],
                   with_engine("FLAGS", form, "", graphed))
        # (a) Blocks that arrive early spin on whole SMs: rank 0 is busy with
        # ~20 ms of matrix products before each call while rank 1 is already
        # in it. The row's time is rank 0's compute time (not the call's), in
        # each form of the two-shot; "alone" is the same products with no call
        # waiting. The fused form loses if its waiting blocks slow rank 0.
        for form in ("alone", "fused", "steps"):
            series(f"busy rank compute, two-shot {form}", [8 * MiB], busy_rank(form))
        # (b) The copy-in ceiling with slots larger than the L2: the plain rows
        # run 8 MiB slots (FASTPAR_CUDA_IPC_SLOT_BYTES's default); a group with
        # 2 MiB slots runs the same calls.
        small_slots = group_with({"FASTPAR_CUDA_IPC_SLOT_BYTES": str(2 * MiB)})
        series("fastpar slot 2 MiB", [s for s in (8 * MiB, 32 * MiB, 128 * MiB) if s <= max(args.ipc_sizes)],
               lambda size: plain(small_slots, size))
        series("fastpar slot 8 MiB", [s for s in (8 * MiB, 32 * MiB, 128 * MiB) if s <= max(args.ipc_sizes)],
               fastpar_plain)
    dist.destroy_process_group()


def ipc_rows(args) -> list:
    import torch

    rows = []
    ngpu = torch.cuda.device_count()
    runs = [("shared", n) for n in args.ranks] + [("distinct", n) for n in args.ranks if 2 <= n <= ngpu]
    # every size over fastpar's own path (the default sends 8+ MiB to NCCL),
    # and room for the registered rows' largest tensor
    os.environ.setdefault("FASTPAR_CUDA_IPC_MAX_BYTES", str(max(args.ipc_sizes)))
    os.environ.setdefault("FASTPAR_CUDA_IPC_REGISTERED_BYTES", str(max(args.ipc_sizes)))
    for i, (placement, n) in enumerate(runs):
        # what is left of --ipc-timeout (counted from this process's start:
        # the caller's `timeout` is) for this run and those after it; the
        # ranks stop starting sizes 10 s before it ends (a slow call, as 3
        # ranks' took 1 s, must not cost the rows measured before it)
        budget = (args.ipc_timeout - (time.monotonic() - _STARTED)) / (len(runs) - i)
        with tempfile.TemporaryDirectory(prefix="fastpar-bench-") as d:
            out = os.path.join(d, "rows.json")
            argv = ["--ipc-worker", "--placement", placement, "--ipc-out", out, "--ranks", str(n),
                    "--host-calls", str(args.host_calls), "--ipc-sizes", ",".join(map(str, args.ipc_sizes)),
                    "--stop-at", str(time.time() + max(budget - 10, budget / 2))]
            try:
                run_ranks(os.path.abspath(__file__), argv, n, timeout=max(budget, 1.0))
            except SystemExit as e:  # run_ranks exits when a rank fails
                rows.append(gs.ipc_row("fastpar", f"{placement} (ranks failed)", n, 0, None, None, str(e)))
            if os.path.exists(out):  # whole: rank 0 renames a finished file over it
                with open(out) as f:
                    rows += json.load(f)
    return rows


def check_worker(args) -> None:
    """One rank of the correctness check: --check-calls mixed calls over CUDA
    IPC (all_reduce, broadcast, all_gather_into_tensor, reduce_scatter_tensor;
    float32, bfloat16, int32; odd sizes; views at odd element offsets), each
    in a form drawn at random (fused or steps, for the two-shot and the other
    collectives alike; the one-kernel calls' block barriers with the peer's
    flag polled or flags written into the waiter's memory), compared bit for bit with the result computed on the
    CPU in rank order (every rank makes every rank's input from the seed), in a
    group whose timeout is 10 s. Rank 0 writes the wrong calls (at most 10) as
    rows with an error; none wrong: one row without."""
    import random

    import torch
    import torch.distributed as dist

    import fastpar
    import fastpar.distributed as fd

    rank, n = args.rank, args.ranks[0]
    torch.cuda.set_device(0 if args.placement == "shared" else rank % torch.cuda.device_count())
    store = dist.TCPStore("127.0.0.1", args.port, n, rank == 0, timeout=datetime.timedelta(seconds=60),
                          wait_for_workers=False)
    dist.init_process_group("fastpar", store=store, rank=rank, world_size=n, timeout=datetime.timedelta(seconds=10))
    engine = fd.get_fastpar_backend().cuda_engine
    override = fastpar._C._testing.cuda_override
    draw = random.Random(1234)
    wrong = []

    def rank_order(xs, dtype):
        acc = xs[0].float() if dtype.is_floating_point else xs[0].clone()
        for x in xs[1:]:
            acc = acc + (x.float() if dtype.is_floating_point else x)
        return acc.to(dtype)

    def bits(t):
        return t.detach().cpu().contiguous().view(torch.uint8)

    for i in range(args.check_calls):
        op = draw.choice(["all_reduce", "broadcast", "all_gather", "reduce_scatter"])
        form = draw.choice(["fused", "steps"])
        dtype = draw.choice([torch.float32, torch.bfloat16, torch.int32])
        count = draw.choice([1, 3, 17, 1001, 4097, 65537, draw.randrange(1, 1 << 21)])
        offset = draw.choice([0, 1, 3])
        flags = draw.choice(["peer", "waiter"])
        per = count * (n if op == "reduce_scatter" else 1)

        def data(r):
            g = torch.Generator().manual_seed(i * 131 + r)
            if dtype.is_floating_point:
                return torch.randn(per, generator=g).to(dtype)
            return torch.randint(-1000, 1000, (per,), generator=g, dtype=dtype)

        def on_gpu(x):
            buf = torch.empty(x.numel() + offset, dtype=dtype, device="cuda")
            view = buf[offset:]
            view.copy_(x)
            return view

        inputs = [data(r) for r in range(n)]
        override(engine, "FASTPAR_CUDA_IPC_TWO_SHOT", form)
        override(engine, "FASTPAR_CUDA_IPC_COLLECTIVES", form)
        override(engine, "FASTPAR_CUDA_IPC_FLAGS", flags)
        try:
            if op == "all_reduce":
                got = on_gpu(inputs[rank])
                dist.all_reduce(got)
                want = rank_order(inputs, dtype)
            elif op == "broadcast":
                got = on_gpu(inputs[rank])
                dist.broadcast(got, i % n)
                want = inputs[i % n]
            elif op == "all_gather":
                got = on_gpu(torch.zeros(n * count, dtype=dtype))
                dist.all_gather_into_tensor(got, on_gpu(inputs[rank]))
                want = torch.cat(inputs)
            else:
                got = on_gpu(torch.zeros(count, dtype=dtype))
                dist.reduce_scatter_tensor(got, on_gpu(inputs[rank]))
                want = rank_order(inputs, dtype)[rank * count:(rank + 1) * count]
            ok = torch.equal(bits(got), bits(want))
            err = None if ok else "wrong bits"
        except Exception as e:  # a failed communicator fails every later call: stop
            ok, err = False, _err(e)
        if not ok:
            wrong.append({"part": "check", "ranks": n, "placement": args.placement, "calls": i + 1,
                          "error": f"call {i} on rank {rank}: {op} of {count} {dtype} at offset {offset}, "
                                   f"{form}: {err}"})
        if over_any(dist, len(wrong)) or len(wrong) >= 10:
            break
    failures = [None] * n
    dist.all_gather_object(failures, wrong)
    if rank == 0:
        rows = [w for ws in failures for w in ws][:10]
        write_rows(rows or [{"part": "check", "ranks": n, "placement": args.placement, "calls": args.check_calls}],
                   args.ipc_out)
    dist.destroy_process_group()


def over_any(dist, k: int) -> bool:
    """Whether any rank has found a wrong call (every rank stops together)."""
    import torch

    t = torch.tensor([k], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=_check_gloo(dist))
    return t.item() > 0


_GLOO = []


def _check_gloo(dist):
    if not _GLOO:
        _GLOO.append(dist.new_group(backend="gloo"))
    return _GLOO[0]


def check_rows(args) -> list:
    """The correctness check (check_worker) with 2 ranks sharing cuda:0, and
    on distinct GPUs where there are two."""
    import torch

    rows = []
    os.environ.setdefault("FASTPAR_CUDA_IPC_MAX_BYTES", str(64 * MiB))
    runs = [("shared", 2)] + ([("distinct", 2)] if torch.cuda.device_count() >= 2 else [])
    for placement, n in runs:
        with tempfile.TemporaryDirectory(prefix="fastpar-check-") as d:
            out = os.path.join(d, "rows.json")
            argv = ["--check-worker", "--placement", placement, "--ipc-out", out, "--ranks", str(n),
                    "--check-calls", str(args.check_calls)]
            try:
                run_ranks(os.path.abspath(__file__), argv, n, timeout=args.ipc_timeout)
            except SystemExit as e:
                rows.append({"part": "check", "ranks": n, "placement": placement, "error": f"ranks failed: {e}"})
            if os.path.exists(out):
                with open(out) as f:
                    rows += json.load(f)
    return rows


def synthetic_rows(args) -> list:
    """Plausible rows without a GPU (--dry-run): every part, every column."""
    rows = []
    for k in args.ks:
        for dname in args.dtypes:
            for size in args.sizes:
                nbytes = 2 * k * size
                t_copy = 3e-6 + nbytes / 2.9e12
                t_base = 8e-6 + nbytes / 1.0e12
                for alg in args.algorithms:
                    t = (4e-6 + nbytes / 2.7e12) if alg == "direct" else (30e-6 * k + nbytes / 1.5e12)
                    rows.append(gs.list_row(gs.ONE_GPU, k, dname, alg, size, t, "torch stack+sum+copies", t_base,
                                            t_copy))
    rows += [gs.host_row("torch add_ (one launch)", 1, 5.8e-6), gs.host_row("direct", 2, 6.5e-6),
             gs.host_row("direct", 8, 14e-6), gs.host_row("ring", 2, None, "RuntimeError: synthetic failure")]
    for n in args.ranks:
        rows += [gs.ref_row("launch_us", "shared cuda:0", n, 6.9), gs.ref_row("copy_GBps", "shared cuda:0", n, 4200)]
        hi = 2 * MiB if n == 2 else 512 * KiB
        rows.append(gs.ref_row("one_shot_max_bytes", "shared cuda:0", n, hi))
        for size in args.ipc_sizes:
            rows.append(gs.ipc_row("fastpar", "shared cuda:0", n, size, (n - 1) * (10e-6 + size / 500e9),
                                   9e-6 if size <= 256 * KiB else None))
            if n > 2 and 256 * KiB <= size <= 2 * MiB:  # the other schedule: faster above 256 KiB
                rows.append(gs.ipc_row("fastpar two-shot forced" if size <= hi else "fastpar one-shot forced",
                                       "shared cuda:0", n, size, (n - 1) * (10e-6 + size / 500e9) *
                                       (1.2 if size <= hi else 1.5)))
            if size > 256 * KiB:  # the step-by-step two-shot: 2mn + 1 operations of ~8 us
                m = -(-size // (8 * MiB))
                rows.append(gs.ipc_row("fastpar two-shot steps", "shared cuda:0", n, size,
                                       (2 * m * n + 1) * 8e-6 + size / 500e9))
            if n > 2:
                continue
            if size in (4 * KiB, 256 * KiB, 8 * MiB):  # (c): the two forms of the block barriers' flags
                for form, t in (("peer", 10e-6), ("waiter", 9e-6)):
                    rows.append(gs.ipc_row(f"fastpar flags {form}", "shared cuda:0", n, size, t + size / 500e9))
            if size <= 256 * KiB:
                rows.append(gs.ipc_row("fastpar graph", "shared cuda:0", n, size, 8e-6 + size / 500e9, 3e-6))
                rows.append(gs.ipc_row("fastpar direct", "shared cuda:0", n, size, 9e-6 + size / 500e9, 7e-6))
                if size == 4 * KiB:
                    rows.append(gs.ipc_row("torch fake backend", "shared cuda:0", n, size, None, 2e-6))
            else:
                rows.append(gs.ipc_row("fastpar registered", "shared cuda:0", n, size, 10e-6 + size / 600e9))
    return rows


def header() -> str:
    """Date, GPU, driver, torch, CUDA and NCCL versions: the README's context lines."""
    import torch

    lines = [f"date (UTC): {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}",
             f"torch {torch.__version__}, CUDA {torch.version.cuda}"]
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        lines.append(f"GPUs: {len(names)} x {', '.join(sorted(set(names)))}")
        try:
            lines.append("NCCL " + ".".join(map(str, torch.cuda.nccl.version())))
        except Exception as e:
            lines.append(f"NCCL: unknown ({_err(e)})")
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", default="all", help=f"comma-separated parts: {', '.join(PARTS)} (default all)")
    p.add_argument("--quick", action="store_true", help="sizes x16 apart, k = 2 and 8 only")
    p.add_argument("--ks", default="2,4,8")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--algorithms", default="direct,ring")
    p.add_argument("--min-size", type=int, default=4 * KiB)
    p.add_argument("--max-size", type=int, default=256 * MiB)
    p.add_argument("--ranks", default="2,3,4", help="processes for the ipc part: one run per count (2..8)")
    p.add_argument("--ipc-sizes", default=f"{4 * KiB},{256 * KiB},{MiB},{8 * MiB},{32 * MiB},{128 * MiB}")
    p.add_argument("--host-calls", type=int, default=3000)
    p.add_argument("--ipc-timeout", type=float, default=90,
                   help="seconds for the ipc part, shared among its multi-process runs")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "gpu"))
    p.add_argument("--rows-in", default="", help="comma-separated JSON files of rows from earlier parts to report with")
    p.add_argument("--rows-out", default="", help="also write this run's rows as JSON (for a later --rows-in)")
    p.add_argument("--dry-run", action="store_true", help="synthetic rows, no CUDA: checks the reporting code")
    p.add_argument("--report-only", action="store_true", help="measure nothing: report the --rows-in rows")
    p.add_argument("--time-limit", type=float, default=0,
                   help="seconds: the list sweep stops starting new sizes after this (0: no limit)")
    # the processes ipc_rows starts
    p.add_argument("--check-calls", type=int, default=10000, help="calls of the correctness check (--part check)")
    p.add_argument("--ipc-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--check-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--placement", default="shared", help=argparse.SUPPRESS)
    p.add_argument("--ipc-out", default="", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--stop-at", type=float, default=float("inf"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.parts = PARTS if args.part == "all" else tuple(x for x in args.part.split(",") if x)
    bad = [x for x in args.parts if x not in PARTS]
    if bad:
        p.error(f"--part {bad[0]!r} is not one of {', '.join(PARTS)}")
    args.ks = [int(k) for k in args.ks.split(",")]
    args.dtypes = args.dtypes.split(",")
    args.algorithms = args.algorithms.split(",")
    if args.quick:
        args.ks = [k for k in args.ks if k in (2, 8)] or args.ks[:1]
    args.sizes = sizes(args.min_size, args.max_size, 16 if args.quick else 4)
    args.ipc_sizes = [int(s) for s in args.ipc_sizes.split(",")]
    args.stop_at = time.time() + args.time_limit if args.time_limit > 0 else float("inf")
    try:
        args.ranks = [int(x) for x in str(args.ranks).split(",") if x]
    except ValueError:
        p.error(f"--ranks is {args.ranks!r} but must be comma-separated counts between 2 and 8")
    bad = [n for n in args.ranks if not 2 <= n <= 8]
    if bad or not args.ranks:
        p.error(f"--ranks has {bad[0] if bad else 'nothing'} but every count must be between 2 and 8")
    return args


def write_rows(rows: list, path: str) -> None:
    """The rows as JSON at `path` (none: nothing), whole: a temporary file renamed over it."""
    if path:
        with open(path + ".tmp", "w") as f:
            json.dump(rows, f)
        os.replace(path + ".tmp", path)


def main(argv=None) -> list:
    args = parse_args(argv)
    if args.ipc_worker:
        ipc_worker(args)
        return []
    if args.check_worker:
        check_worker(args)
        return []
    rows = []
    for path in filter(None, args.rows_in.split(",")):
        with open(path) as f:
            rows += json.load(f)
    if args.dry_run:
        rows += synthetic_rows(args)
        head = "dry run: synthetic rows, nothing measured\n"
    elif args.report_only:
        head = header()
    else:
        import torch

        if not torch.cuda.is_available():
            sys.exit("bench_cuda.py needs a GPU (use --dry-run to check the reporting code)")
        head = header()
        print(head, end="")
        measure = {"check": check_rows, "lists": list_rows, "host": host_rows, "ipc": ipc_rows}
        for part in args.parts:
            t0 = time.time()
            try:
                rows += measure[part](args)
            except Exception as e:  # a CUDA error or out of memory ends this part, not the others' rows
                traceback.print_exc()
                rows.append({"part": "failed", "error": f"{part} part: {_err(e)}"})
            print(f"{part}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
            write_rows(rows, args.rows_out)  # after each part: a kill during the next loses nothing
    write_rows(rows, args.rows_out)
    gs.report(rows, args.out, head)
    return rows


if __name__ == "__main__":
    main()
