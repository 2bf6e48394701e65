"""fastpar registered for CPU and CUDA tensors: the backend strings torch
accepts for it, on any machine (GPU or not). Checks which object torch
registers for each device, that CPU collectives stay correct, and that a
tensor on a device fastpar does not serve is refused with its argument and
device; and torchrun with env:// (how users launch it). CUDA
collectives themselves: test_collectives.py (their CUDA shapes need a GPU)."""
import subprocess
import sys

import pytest

from dist_harness import ROOT, WORKER, assert_ok, child_env, free_port, run

pytestmark = pytest.mark.usefixtures("no_leftover_segments")


@pytest.mark.parametrize("spec", ["fastpar", "cpu:fastpar,cuda:fastpar", "cpu:gloo,cuda:fastpar"])
def test_distributed_device_backends(spec):
    results = run("device_backends", 2, args=[spec], timeout=120)
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


@pytest.mark.parametrize("spec", ["fastpar", "cpu:fastpar,cuda:fastpar"])
def test_torchrun_env_init(spec):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), WORKER, "torchrun", "0", "0", "0", spec]
    p = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "torchrun rank 0 ok" in p.stdout and "torchrun rank 1 ok" in p.stdout
