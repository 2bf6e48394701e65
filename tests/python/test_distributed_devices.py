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
