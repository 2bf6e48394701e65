"""Stock DistributedDataParallel on fastpar matches a reference, on each
device: on the CPU, single-process training on the whole batch (2 ranks);
on CUDA tensors, stock DDP and fastpar.DistributedDataParallel against DDP on
a reference group, with fastpar DDP's buckets plain or in the IPC arena
("registered", bucket_storage.py). The CUDA shapes are batched with the
other CUDA scenarios (batched_scenarios.py) and skip without a GPU."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import fastpar
from batched_scenarios import CUDA_LAYOUTS, InBatch, batched, cpu_shape, cuda_shape, scenario_result
from dist_harness import assert_ok, run, scenario
from worker_context import DEV, RANK, SHARED, WORLD, cuda_backend, init, peer_access_everywhere

pytestmark = pytest.mark.usefixtures("no_leftover_segments")
SHAPES = [pytest.param(*cpu_shape(2).values, "plain", id="cpu-2")] + [
    pytest.param(*s.values, buckets, id=f"{s.id}-{buckets}", marks=s.marks)
    for buckets in ("plain", "registered") for s in (cuda_shape(l, w) for l, w in CUDA_LAYOUTS if w in (2, 3))]
# fastpar DDP's buckets on CUDA: plain tensors, or in the IPC arena
DDP_ENV = {"plain": {}, "registered": {"FASTPAR_CUDA_IPC_REGISTERED_BYTES": str(16 << 20)}}


@scenario
def sc_ddp():
    """DDP on fastpar matches a reference, on DEV."""
    (_ddp_cuda if DEV.type == "cuda" else _ddp_cpu)()


def _ddp_cpu():
    """Stock DistributedDataParallel on fastpar matches single-process training."""
    init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()
    ref.load_state_dict(model.state_dict())
    if RANK != 0:  # different local init: DDP must broadcast rank 0's weights
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for step in range(5):
        x = torch.randn(WORLD * 6, 8, generator=g, dtype=torch.float64)
        y = torch.randn(WORLD * 6, 4, generator=g, dtype=torch.float64)
        mine = slice(RANK * 6, (RANK + 1) * 6)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x[mine]), y[mine]).backward()
        opt.step()
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12, msg=lambda m: f"{name}: {m}")
    dist.destroy_process_group()


def _ddp_cuda():
    """Stock DistributedDataParallel and fastpar.DistributedDataParallel on
    cuda:fastpar match the same model trained with DDP on a reference group:
    cuda:nccl on distinct GPUs, cpu:gloo on CPU copies on a shared GPU (NCCL
    cannot run there). Rank 1 starts from different weights: the start-up
    broadcast must fix them."""
    init()
    ref_group = dist.new_group(backend="gloo" if SHARED else "nccl")
    ref_dev = torch.device("cpu") if SHARED else DEV
    torch.manual_seed(0)
    make = lambda: torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    net = make()
    models = {}
    for name, group, dev in (("stock", None, DEV), ("fastpar", None, DEV), ("reference", ref_group, ref_dev)):
        replica = make().to(dev)
        replica.load_state_dict(net.state_dict())
        if RANK == 1 and name != "reference":
            with torch.no_grad():
                for p in replica.parameters():
                    p.add_(1.0)
        ids = [DEV.index] if dev.type == "cuda" else None
        if name == "fastpar":
            ddp = fastpar.DistributedDataParallel(replica, device_ids=ids, process_group=group, bucket_cap_mb=1)
        else:
            ddp = torch.nn.parallel.DistributedDataParallel(replica, device_ids=ids, process_group=group,
                                                            bucket_cap_mb=1)
        models[name] = (ddp, torch.optim.SGD(ddp.parameters(), lr=0.1), dev)
    for step in range(5):
        g = torch.Generator().manual_seed(step * 100 + RANK)
        x = torch.randn(32, 64, generator=g)
        y = torch.randint(0, 10, (32,), generator=g)
        for ddp, opt, dev in models.values():
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x.to(dev)), y.to(dev)).backward()
            opt.step()
    ref_params = [p.detach().cpu() for p in models["reference"][0].parameters()]
    for name in ("stock", "fastpar"):
        for (n1, p1), p2 in zip(models[name][0].named_parameters(), ref_params):
            if WORLD == 2 and not SHARED:  # two addends and the same GPU kernels: the same bits
                assert torch.equal(p1.cpu(), p2), f"{name} DDP: {n1} differs from the reference"
            else:
                torch.testing.assert_close(p1.cpu(), p2, rtol=1e-4, atol=1e-5,
                                           msg=lambda m: f"{name} DDP: {n1}: {m}")
    if peer_access_everywhere():
        assert cuda_backend().ipc_calls >= 10, cuda_backend().ipc_calls
    if SHARED:
        assert cuda_backend().fallback_calls == 0, cuda_backend().fallback_calls
    registered = int(os.environ.get("FASTPAR_CUDA_IPC_REGISTERED_BYTES", "0")) > 0
    from fastpar.bucket_storage import storage_kind
    assert storage_kind(None, DEV) == ("registered" if registered else "torch.empty"), storage_kind(None, DEV)
    dist.destroy_process_group()
    print(f"ddp rank {RANK} ok", flush=True)


@pytest.mark.parametrize("device,layout,world,buckets", SHAPES)
@batched(lambda p: InBatch(sc_ddp, env=DDP_ENV[p["buckets"]], id=f"ddp-{p['buckets']}") if p["device"] == "cuda"
         else None)
def test_stock_ddp_matches_a_reference(request, device, layout, world, buckets):
    if device == "cuda":
        assert_ok(scenario_result(request))
    else:
        assert_ok(run(sc_ddp, world))
