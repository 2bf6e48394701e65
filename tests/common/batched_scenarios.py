"""The pytest side of the multi-process scenarios on each device: the shapes
(device, GPU layout, world size) a test is parametrized by, with the CUDA
ones skipped exactly where the machine cannot run them, and the batching:
one launch of WORLD processes per shape runs every selected scenario of that
shape in turn (dist_worker.py "batch"), each in its own process group, and
each test checks its own scenario's report, so a failure is still reported
by the test's name. A test names its scenario with @batched(sc_NAME) (the
@scenario function, in the same test module); the batch of a shape gathers
the scenarios of every selected test of the session, whatever its module.

A launch costs seconds (processes, CUDA contexts, MPS clients): 46 CUDA
launches did not fit the GPU check's time, 14 do on one GPU; on the CPU,
starting Python + torch dominates the time on a loaded 2-core machine.
Scenarios that end their processes (a SIGKILL, abort(), the p2p mismatch)
keep a launch each.

GPU layouts (worker_context.py, FASTPAR_TEST_GPU_LAYOUT):
  shared    2-4 ranks all on cuda:0: needs one GPU. NCCL cannot run there
            ("Duplicate GPU detected"), so every call is over CUDA IPC or
            refused by name. Start the MPS daemon (nvidia-cuda-mps-control -d)
            first for speed: without it the GPU time-slices between the
            processes and each collective takes milliseconds (still correct).
  distinct  rank r on cuda:r: needs >= 2 GPUs; IPC where every pair has peer
            access, NCCL above FASTPAR_CUDA_IPC_MAX_BYTES (phase-protocol
            collectives only).
CUDA shapes carry the marker `cuda` (what scripts/gpu_check.sh's
multi-process phase runs) and skip without a GPU or in CPU-only builds of
fastpar."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import pytest
import torch

import fastpar
from dist_harness import run, scenario_ref, shm_entries
from scenario_batch import section

NGPU = torch.cuda.device_count() if torch.cuda.is_available() else 0
CUDA_MARKS = [
    pytest.mark.cuda,
    pytest.mark.skipif(not fastpar._C.built_with_cuda, reason="CPU-only build of fastpar"),
    pytest.mark.skipif(NGPU < 1, reason="needs a CUDA device"),
]


def cuda_only(fn):
    """Marks a test that runs on CUDA tensors only, as CUDA_MARKS mark a shape."""
    for mark in CUDA_MARKS:
        fn = mark(fn)
    return fn


needs_two_gpus = pytest.mark.skipif(NGPU < 2, reason="the distinct-GPU layout needs at least 2 CUDA devices")

# (layout, world) pairs this machine can run.
CUDA_LAYOUTS = [("shared", 2), ("shared", 3), ("shared", 4)]
if NGPU >= 2:
    CUDA_LAYOUTS += sorted({("distinct", 2), ("distinct", min(NGPU, 4))})
TWO_RANK_LAYOUT = "shared" if NGPU < 2 else "distinct"  # of the 2-rank CUDA tests without a layout parameter


def cpu_shape(world: int):
    return pytest.param("cpu", None, world, id=f"cpu-{world}")


def cuda_shape(layout: str, world: int, marks=()):
    return pytest.param("cuda", layout, world, id=f"cuda-{layout}-{world}", marks=[*CUDA_MARKS, *marks])


def shapes(cpu_worlds=(), cuda_layouts=None):
    """pytest params (device, layout, world): the CPU world sizes, then the
    CUDA (layout, world) pairs (default: every pair this machine can run)."""
    return [cpu_shape(w) for w in cpu_worlds] + [cuda_shape(l, w) for l, w in
                                                  (CUDA_LAYOUTS if cuda_layouts is None else cuda_layouts)]


# The launch environment of a CPU shape: a 4 KiB slot makes the larger sizes
# cross many chunks; registered buffers of every size take the zero-copy
# schedule (by default only >= 16 MiB do); on 4 ranks, one-shot only up to
# 64 B: above it registered buffers take their own schedule.
SMALL_SLOT = {"FASTPAR_SHM_SLOT_BYTES": "4096", "FASTPAR_SHM_REGISTERED_BYTES": str(4 << 20),
              "FASTPAR_SHM_REGISTERED_MIN_BYTES": "0"}


def cpu_launch_env(world: int) -> dict:
    return {**SMALL_SLOT, "FASTPAR_SHM_ONESHOT_MAX_BYTES": "64"} if world == 4 else dict(SMALL_SLOT)


# What a new process's first CUDA call says while the MPS server is still
# cleaning up after SIGKILLed clients (docs/gpu.md): it takes clients again
# within seconds.
GPU_BUSY = ("busy or unavailable", "cudaErrorDevicesUnavailable", "MPS server is not ready")


def run_cuda(scenario, world, layout, env=None, args=(), timeout=150):  # a hang must not eat the phase
    """One launch of dist_worker.py on CUDA tensors in `layout`."""
    before = shm_entries()
    env = dict(env or {}, FASTPAR_TEST_DEVICE="cuda", FASTPAR_TEST_GPU_LAYOUT=layout)
    for attempt in range(4):  # a launch refused by a busy MPS server is retried, 5 s apart
        results = run(scenario, world, env=env, args=args, timeout=timeout)
        if not any(r.rc != 0 and any(w in r.err for w in GPU_BUSY) for r in results) or attempt == 3:
            break
        time.sleep(5)
    assert shm_entries() - before == set(), "fastpar segments left in /dev/shm"
    return results


SLOT_4K = {"FASTPAR_CUDA_IPC_SLOT_BYTES": "4096"}
REGISTERED = {"FASTPAR_CUDA_IPC_REGISTERED_BYTES": str(8 << 20), "FASTPAR_CUDA_IPC_SLOT_BYTES": "65536",
              "FASTPAR_TEST_TIMEOUT_S": "30"}
PER_SCENARIO_S = 90  # the longest scenario (collectives on 4 ranks) takes well under this
_batches: dict = {}


@dataclass
class InBatch:
    """A scenario as one of a batch: the @scenario function, its ARGS and env,
    its id in the batch's reports (default: the function's name without sc_,
    then the args), and its place: order -1 runs before the others (on CUDA
    "state": the one-time MPS warning it looks for is once per process), 1
    after them (scenarios that fail their groups on purpose), 0 in the order
    the tests were collected."""
    body: Callable[[], None]
    args: Sequence = ()
    env: dict = field(default_factory=dict)
    id: str = ""
    order: int = 0

    def __post_init__(self):
        self.args = [str(a) for a in self.args]
        self.id = self.id or "-".join([self.body.__name__.removeprefix("sc_"), *self.args])


def batched(spec):
    """Marks a test as checking a scenario run in the batch of its (device,
    layout, world): `spec` is a @scenario function, an InBatch, or a function
    of the test's parameters that gives either (None: this shape is not
    batched). A test without a device parameter is a CUDA one."""
    def mark(fn):
        fn.in_batch = spec
        return fn
    return mark


def _in_batch_of(item):
    """(device, layout, world) and the InBatch a collected test checks, or None
    (a test, or a shape of it, with a launch of its own)."""
    spec = getattr(getattr(item, "function", None), "in_batch", None)
    params = item.callspec.params if hasattr(item, "callspec") else {}
    if spec is not None and not isinstance(spec, InBatch) and not hasattr(spec, "scenario_ref"):
        spec = spec(params)
    if spec is None:
        return None
    device = params.get("device", "cuda")
    layout = params.get("layout", TWO_RANK_LAYOUT if device == "cuda" else None)
    return (device, layout, params.get("world", 2)), spec if isinstance(spec, InBatch) else InBatch(spec)


def _run_batch(device, layout, world, specs):
    by_id = {}
    for s in specs:
        assert by_id.setdefault(s.id, s) == s, f"two scenarios of one batch have the id {s.id}"
    ordered = sorted(by_id.values(), key=lambda s: s.order)  # stable: collection order within an order
    specs = [{"id": s.id, "ref": scenario_ref(s.body), "args": s.args, "env": s.env} for s in ordered]
    timeout = 30 + PER_SCENARIO_S * len(specs)
    if device == "cuda":
        return run_cuda("batch", world, layout, args=[json.dumps(specs)], timeout=timeout)
    return run("batch", world, env={**cpu_launch_env(world), "FASTPAR_TEST_DEVICE": "cpu"},
               args=[json.dumps(specs)], timeout=timeout)


def assert_scenario_ok(results, device, name):
    """Every rank exited cleanly; on CUDA each also printed the scenario's own
    last line ("NAME rank R ok"), so a scenario cut short cannot pass."""
    from dist_harness import assert_ok

    assert_ok(results)
    if device == "cuda":
        assert all(f"{name} rank {r.rank} ok" in r.out for r in results), [r.out for r in results]


def scenario_result(request):
    """Runs (once per session) the batch of every selected test of this test's
    (device, layout, world), then returns each rank's report of this test's
    scenario."""
    key, spec = _in_batch_of(request.node)
    if key not in _batches:
        specs = [s for k, s in filter(None, map(_in_batch_of, request.session.items)) if k == key]
        _batches[key] = _run_batch(*key, specs or [spec])
    return [section(r, spec.id) for r in _batches[key]]
