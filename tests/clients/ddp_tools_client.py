"""The tools that come with stock DDP in torch.distributed: a channels_last
conv net (its gradients are not contiguous), ZeroRedundancyOptimizer with its
state consolidated on rank 0, the PowerSGD communication hook, Join with
uneven inputs, and the object collectives."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.distributed.algorithms.join import Join
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from client_common import RANK, WORLD, run_both


def batches(steps: int, *shape: int, memory_format=torch.contiguous_format) -> list:
    g = torch.Generator().manual_seed(100 + RANK)
    return [torch.randn(*shape, generator=g).contiguous(memory_format=memory_format) for _ in range(steps)]


def train(model: nn.Module, opt, xs: list, join: bool = False) -> list:
    losses = []
    with Join([model] + ([opt] if isinstance(opt, ZeroRedundancyOptimizer) else []), enable=join):
        for x in xs:
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
    return losses


def channels_last(backend: str) -> dict:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3)).to(memory_format=torch.channels_last)
    model = DDP(net)
    losses = train(model, torch.optim.SGD(model.parameters(), lr=0.1),
                   batches(3, 4, 3, 12, 12, memory_format=torch.channels_last))
    return {"losses": losses, "params": [p.detach().clone() for p in net.parameters()]}


def zero_redundancy(backend: str) -> dict:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    model = DDP(net)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-2)
    losses = train(model, opt, batches(3, 4, 16))
    opt.consolidate_state_dict(to=0)
    state = opt.state_dict() if RANK == 0 else {}
    moments = [s["exp_avg"] for s in state.get("state", {}).values()]
    return {"losses": losses, "params": [p.detach().clone() for p in net.parameters()], "moments": moments}


def power_sgd(backend: str) -> dict:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    model = DDP(net)
    model.register_comm_hook(powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                                         start_powerSGD_iter=2), powerSGD_hook.powerSGD_hook)
    losses = train(model, torch.optim.SGD(model.parameters(), lr=0.1), batches(4, 4, 32))
    return {"losses": losses, "params": [p.detach().clone() for p in net.parameters()]}


def uneven_inputs(backend: str) -> dict:
    torch.manual_seed(0)
    net = nn.Linear(8, 2)
    model = DDP(net)
    losses = train(model, torch.optim.SGD(model.parameters(), lr=0.1), batches(3 + RANK, 2, 8), join=True)
    return {"losses": losses, "params": [p.detach().clone() for p in net.parameters()]}


def objects(backend: str) -> dict:
    gathered = [None] * WORLD
    dist.all_gather_object(gathered, {"rank": RANK, "name": f"r{RANK}"})
    sent = [{"config": [1, 2.5, "x"]}] if RANK == 0 else [None]
    dist.broadcast_object_list(sent, src=0)
    mine = [None]
    dist.scatter_object_list(mine, [("part", q) for q in range(WORLD)] if RANK == 0 else None, src=0)
    at_root = [None] * WORLD if RANK == 0 else None
    dist.gather_object(RANK * 5, at_root, dst=0)
    return {"gathered": gathered, "sent": sent, "mine": mine, "at_root": at_root}


if __name__ == "__main__":
    run_both(channels_last, "DDP of a channels_last conv net")
    run_both(zero_redundancy, "ZeroRedundancyOptimizer")
    run_both(power_sgd, "the PowerSGD hook")
    run_both(uneven_inputs, "Join with uneven inputs")
    run_both(objects, "the object collectives")
