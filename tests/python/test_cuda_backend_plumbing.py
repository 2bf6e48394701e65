"""fastpar._C.CudaBackend without a GPU: construction, its knobs from the
environment, and the forwarding of every non-all_reduce call to its fallback
backend, with a one-rank gloo group standing in for NCCL (the class itself
never touches the GPU until the first CUDA all_reduce). The CUDA paths:
test_cuda_backend.py (needs >= 2 GPUs)."""
import datetime
import os

import pytest
import torch
import torch.distributed as dist

import fastpar

pytestmark = pytest.mark.skipif(not fastpar._C.built_with_cuda, reason="CudaBackend exists in CUDA builds only")


def make():
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = dist.HashStore()
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), 0, 1, datetime.timedelta(seconds=10))
    return fastpar._C.CudaBackend(store, 0, 1, 10_000, gloo)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for k in ("FASTPAR_CUDA_IPC_MAX_BYTES", "FASTPAR_CUDA_IPC_SLOT_BYTES", "FASTPAR_BLOCKING_WAIT"):
        monkeypatch.delenv(k, raising=False)


def test_defaults_and_state():
    cb = make()
    assert cb.ipc_state == "not set up"
    assert cb.max_ipc_bytes == 8 << 20
    assert cb.blocking_wait is False
    assert isinstance(cb.fallback, dist.ProcessGroupGloo)
    assert cb.ipc_calls == 0 and cb.fallback_calls == 0


def test_knobs_from_the_environment(monkeypatch):
    monkeypatch.setenv("FASTPAR_CUDA_IPC_MAX_BYTES", "0")
    monkeypatch.setenv("FASTPAR_BLOCKING_WAIT", "1")
    cb = make()
    assert cb.max_ipc_bytes == 0 and cb.blocking_wait is True


@pytest.mark.parametrize("name,value,words", [
    ("FASTPAR_CUDA_IPC_MAX_BYTES", "8M", "FASTPAR_CUDA_IPC_MAX_BYTES is '8M' but must be a byte count"),
    ("FASTPAR_CUDA_IPC_MAX_BYTES", "-1", "FASTPAR_CUDA_IPC_MAX_BYTES is '-1'"),
    ("FASTPAR_CUDA_IPC_SLOT_BYTES", "100", "FASTPAR_CUDA_IPC_SLOT_BYTES is '100' but must be a byte count (decimal digits) >= 4096"),
    ("FASTPAR_BLOCKING_WAIT", "yes", "FASTPAR_BLOCKING_WAIT is 'yes' but must be 0 or 1"),
])
def test_bad_knobs_are_refused_by_name(monkeypatch, name, value, words):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        make()


def test_fallback_is_required():
    with pytest.raises((TypeError, ValueError)):
        fastpar._C.CudaBackend(dist.HashStore(), 0, 1, 1000, None)


def test_other_collectives_go_to_the_fallback():
    cb = make()
    t = torch.arange(6, dtype=torch.float32)
    cb.broadcast([t]).wait()
    assert torch.equal(t, torch.arange(6, dtype=torch.float32))
    out = [torch.zeros(6)]
    cb.allgather([out], [t]).wait()
    assert torch.equal(out[0], t)
    cb.barrier().wait()
    assert cb.ipc_state == "not set up"  # only a CUDA all_reduce sets IPC up


def test_all_reduce_refuses_non_cuda_tensors_by_argument_and_device():
    cb = make()
    with pytest.raises(ValueError, match=r"fastpar.all_reduce: tensors\[0\] is on device 'cpu' but fastpar's CUDA "
                                         r"backend handles CUDA tensors only"):
        cb.allreduce([torch.ones(3)])
    with pytest.raises(ValueError, match=r"expected exactly one tensor in tensors \(one per process\), got 2"):
        cb.allreduce([torch.ones(3), torch.ones(3)])
    assert cb.ipc_state == "not set up"
