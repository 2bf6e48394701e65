"""DTensor: tensor parallel and sequence parallel MLP blocks (forward and
backward), and redistribute between placements."""
import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from client_common import RANK, WORLD, run_both


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)

    def forward(self, x):
        return self.down(torch.relu(self.up(self.norm(x))))


def grads(module) -> dict:
    return {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).clone()
            for n, p in module.named_parameters()}


def run(backend: str) -> dict:
    mesh = init_device_mesh("cpu", (WORLD,))
    out = {}
    # Tensor parallel: up column-wise, down row-wise (an all_reduce of partial sums).
    torch.manual_seed(0)
    tp = parallelize_module(Block(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    x = torch.randn(4, 6, 16, generator=torch.Generator().manual_seed(7))  # same input on every rank
    y = tp(x)
    y.sum().backward()
    out["tp"] = {"out": y.clone(), "grads": grads(tp)}
    # Sequence parallel: activations sharded on the sequence dim around the
    # TP pair (all_gather in, reduce_scatter out).
    torch.manual_seed(0)
    sp = parallelize_module(Block(), mesh, {
        "norm": SequenceParallel(),
        "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    })
    ys = sp(x.chunk(WORLD, dim=1)[RANK])  # this rank's part of the sequence
    assert isinstance(ys, DTensor) and ys.placements == (Shard(1),), ys
    ys.to_local().sum().backward()
    out["sp"] = {"out": ys.full_tensor(), "local_out": ys.to_local().clone(), "grads": grads(sp)}
    # redistribute
    g = torch.Generator().manual_seed(11)
    full = torch.randn(6, 10, generator=g)
    s0 = distribute_tensor(full, mesh, [Shard(0)])
    out["shard0_to_replicate"] = s0.redistribute(mesh, [Replicate()]).to_local()
    out["shard0_to_shard1"] = s0.redistribute(mesh, [Shard(1)]).to_local()
    out["full_tensor"] = s0.full_tensor()
    mine = torch.randn(6, 10, generator=torch.Generator().manual_seed(20 + RANK))
    partial = DTensor.from_local(mine, mesh, [Partial()])
    out["partial_to_shard0"] = partial.redistribute(mesh, [Shard(0)]).to_local()
    out["partial_to_replicate"] = DTensor.from_local(mine, mesh, [Partial()]).redistribute(
        mesh, [Replicate()]).to_local()
    assert torch.equal(out["full_tensor"], full), "full_tensor of a Shard(0) DTensor is not the tensor"
    assert torch.equal(out["shard0_to_replicate"], full)
    return out


if __name__ == "__main__":
    run_both(run, "DTensor TP, SP and redistribute results")
