"""fastpar registered for CPU and CUDA tensors: the backend strings torch
accepts for it, on any machine (GPU or not). Checks which object torch
registers for each device, that CPU collectives stay correct, and that a
tensor on a device fastpar does not serve is refused with its argument and
device; and torchrun with env:// (how users launch it). CUDA
collectives themselves: test_collectives.py (their CUDA shapes need a GPU)."""
from __future__ import annotations

import datetime
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import fastpar
import fastpar.distributed as fd
from dist_harness import ROOT, WORKER, assert_ok, child_env, free_port, run, scenario, scenario_ref
from reference import exact_data, reference
from worker_context import ARGS, RANK, TIMEOUT_S, WORLD, check, finish, init

pytestmark = pytest.mark.usefixtures("no_leftover_segments")


@scenario
def sc_device_backends():
    """init_process_group(ARGS[0]) with fastpar registered for cpu and cuda, on
    any machine: torch builds one fastpar object and registers it for CUDA (and
    for CPU unless ARGS[0] names another CPU backend); CPU collectives are
    right; tensors on a device fastpar does not serve are refused by name."""
    spec = ARGS[0]
    init(backend=spec)
    pg = dist.group.WORLD
    on_cuda = pg._get_backend(torch.device("cuda"))
    assert isinstance(on_cuda, fastpar._C.Backend), f"{spec}: CUDA backend is {type(on_cuda).__name__}"
    if fd.cuda_supported():
        assert isinstance(on_cuda.cuda_engine, fastpar._C.CudaEngine), type(on_cuda.cuda_engine)
        assert on_cuda.cuda_engine.ipc_state == "not set up", on_cuda.cuda_engine.ipc_state
    else:  # CPU-only build or no GPU: CUDA tensors get the error, as before
        assert on_cuda.cuda_engine is None, on_cuda.cuda_engine
    on_cpu = pg._get_backend(torch.device("cpu"))
    if spec.startswith("cpu:gloo"):
        assert isinstance(on_cpu, dist.ProcessGroupGloo), type(on_cpu)
    else:
        assert isinstance(on_cpu, fastpar._C.Backend) and on_cpu.local_size == WORLD, type(on_cpu)
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for n in (0, 5, 3001):
            xs = [exact_data(q, n, dtype) for q in range(WORLD)]
            tag = f"{spec} {dtype} n={n}"
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
                t = xs[RANK].clone()
                dist.all_reduce(t, op=op)
                check(t, reference(xs, op), f"all_reduce {op} {tag}")
            t = xs[RANK].clone()
            dist.broadcast(t, src=WORLD - 1)
            check(t, xs[WORLD - 1], f"broadcast {tag}")
            out = [torch.empty(n, dtype=dtype) for _ in range(WORLD)]
            dist.all_gather(out, xs[RANK])
            for q in range(WORLD):
                check(out[q], xs[q], f"all_gather [{q}] {tag}")
    t = exact_data(RANK, 64, torch.float32)
    work = dist.all_reduce(t, async_op=True)
    assert work.wait() is True
    check(work.get_future().wait()[0], reference([exact_data(q, 64, torch.float32) for q in range(WORLD)],
                                                 dist.ReduceOp.SUM), f"{spec} async all_reduce")
    dist.barrier()
    # A device fastpar does not serve. Called on the backend object itself:
    # torch's dispatcher answers collectives on meta tensors without calling
    # any backend (dist.all_reduce(meta) returns at once, as for every backend).
    meta = torch.empty(4, device="meta")
    calls = {
        "fastpar.all_reduce: tensors[0] is on device 'meta'": lambda: on_cuda.allreduce([meta]),
        "fastpar.broadcast: tensors[0] is on device 'meta'": lambda: on_cuda.broadcast([meta]),
        "fastpar.all_gather: input_tensors[0] is on device 'meta'":
            lambda: on_cuda.allgather([[meta] * WORLD], [meta]),
    }
    for want, call in calls.items():
        try:
            call()
        except ValueError as e:
            assert want in str(e) and "handles CPU and CUDA tensors only" in str(e), f"{want!r} not in: {e}"
        else:
            raise AssertionError(f"no error; expected {want!r}")
    t = torch.full((3,), float(RANK))
    dist.all_reduce(t)  # still usable after the refusals
    assert torch.all(t == sum(range(WORLD)))
    print(f"{spec}: rank {RANK} ok", flush=True)
    finish()


@pytest.mark.parametrize("spec", ["fastpar", "cpu:fastpar,cuda:fastpar", "cpu:gloo,cuda:fastpar"])
def test_distributed_device_backends(spec):
    results = run(sc_device_backends, 2, args=[spec], timeout=120)
    assert_ok(results)
    for r in results:
        assert f"{spec}: rank {r.rank} ok" in r.out, r.out + r.err


def test_bound_device_reaches_the_backend_on_torch_without_process_group_in_the_options():
    """torch 2.11 (the GPU machine's) does not pass the group to the backend's
    creator; the device of init_process_group(device_id=...) is then read from
    the torch function that calls the creator."""
    import torch

    from fastpar.distributed import backend

    class OptionsOfTorch211:  # no process_group attribute
        pass

    class OptionsOfTorch214:
        class process_group:
            bound_device_id = torch.device("cuda", 1)

    def _create_from_options(opts):
        return backend._bound_device(opts)

    def _new_process_group_helper(device_id):
        return _create_from_options(OptionsOfTorch211())

    assert _new_process_group_helper(torch.device("cuda", 3)) == torch.device("cuda", 3)
    assert _new_process_group_helper(None) is None
    assert _create_from_options(OptionsOfTorch211()) is None  # called from elsewhere: no device
    assert _create_from_options(OptionsOfTorch214()) == torch.device("cuda", 1)


@scenario
def sc_torchrun():
    """Run under torchrun (env://): the 'done when' smoke test. ARGS[0], if
    given, is the backend string (default "fastpar")."""
    spec = ARGS[0] if ARGS else "fastpar"
    dist.init_process_group(spec, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    r, w = dist.get_rank(), dist.get_world_size()
    t = torch.full((4,), float(r))
    dist.all_reduce(t)
    assert torch.all(t == sum(range(w)))
    assert dist.get_backend() == spec, dist.get_backend()
    assert isinstance(dist.group.WORLD._get_backend(torch.device("cuda")), fastpar._C.Backend)
    dist.destroy_process_group()
    print(f"torchrun rank {r} ok")


@pytest.mark.parametrize("spec", ["fastpar", "cpu:fastpar,cuda:fastpar"])
def test_torchrun_env_init(spec):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), WORKER, scenario_ref(sc_torchrun), "0", "0", "0", spec]
    p = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "torchrun rank 0 ok" in p.stdout and "torchrun rank 1 ok" in p.stdout
