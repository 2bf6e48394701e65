"""Accelerate on 2 CPU processes, with the process group created first
(init_process_group("fastpar")): Accelerate's own backend choice on the CPU
is gloo or mpi only (docs/clients.md), and it keeps a group that exists."""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset

from client_common import run_both


def run(backend: str) -> dict:
    AcceleratorState._reset_state(reset_partial_state=True)  # the gloo run's state must not leak in
    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == dist.get_world_size() and dist.get_backend() == backend
    set_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(5)
    data = TensorDataset(torch.randn(48, 6, generator=g), torch.randn(48, 2, generator=g))
    model, opt, loader = accelerator.prepare(model, opt, DataLoader(data, batch_size=6))
    losses, gathered = [], []
    for x, y in loader:
        loss = F.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), reduction="mean"))
        gathered.append(accelerator.gather_for_metrics(model(x).detach()))
    accelerator.wait_for_everyone()
    params = {k: v.detach().clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}
    return {"losses": losses, "gathered": gathered, "params": params}


if __name__ == "__main__":
    run_both(run, "Accelerate losses, gathered outputs and parameters")
