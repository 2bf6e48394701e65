"""FSDP2 (fully_shard) training, then its full state dict saved with
torch.distributed.checkpoint and loaded into a fresh sharded model."""
import os

import torch
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from client_common import RANK, TMP, WORLD, run_both, same

FULL = StateDictOptions(full_state_dict=True)


def sharded_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    mesh = init_device_mesh("cpu", (WORLD,))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def run(backend: str) -> dict:
    model = sharded_model(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(100 + RANK)
    losses = []
    for _ in range(4):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    # The full state dict (every rank gets whole tensors: all-gathers of the shards).
    full = {k: v.clone() for k, v in get_model_state_dict(model, options=FULL).items()}
    path = os.path.join(TMP, f"ckpt-{backend}")
    dcp.save(full, checkpoint_id=path)
    fresh = sharded_model(1)
    loaded = get_model_state_dict(fresh, options=FULL)
    dcp.load(loaded, checkpoint_id=path)
    set_model_state_dict(fresh, loaded, options=FULL)
    same(get_model_state_dict(fresh, options=FULL), full, f"{backend}: state loaded from the checkpoint")
    # Sharded parameters: this rank's shard of each.
    shards = {k: v.to_local().detach().clone() for k, v in model.state_dict().items()}
    return {"losses": losses, "full_state_dict": full, "local_shards": shards}


if __name__ == "__main__":
    run_both(run, "FSDP2 losses, shards and checkpointed full state dict")
