"""fastpar registered for CPU and CUDA tensors: the backend strings torch
accepts for it, on any machine (GPU or not). Checks which object torch
registers for each device, that CPU collectives stay correct, and that a
tensor on a device fastpar does not serve is refused with its argument and
device. CUDA collectives themselves: test_cuda_backend.py (needs >= 2 GPUs)."""
import pytest

from dist_harness import assert_ok, run, shm_entries


@pytest.mark.parametrize("spec", ["fastpar", "cpu:fastpar,cuda:fastpar", "cpu:gloo,cuda:fastpar"])
def test_distributed_device_backends(spec):
    before = shm_entries()
    results = run("device_backends", 2, args=[spec], timeout=120)
    assert_ok(results)
    for r in results:
        assert f"{spec}: rank {r.rank} ok" in r.out, r.out + r.err
    assert shm_entries() - before == set(), "fastpar segments left in /dev/shm"


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
