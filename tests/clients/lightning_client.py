"""Lightning `fit` with DDP on 2 CPU processes started as torchrun would,
logging a float and an integer metric with sync_dist=True. Lightning asks
every backend but gloo for ReduceOp.AVG (on gloo it sums and divides), and
at the end of an epoch it averages each rank's int64 count of logged samples
that way: ranks that logged different batch sizes give an integer average
that is not a whole number."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from lightning.fabric.utilities.distributed import _sync_ddp_if_available
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

from client_common import RANK, WORLD, same


class Model(LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        # batch_size 3 on rank 0 and 4 on rank 1: after 3 steps the ranks
        # have counted 9 and 12 samples, whose int64 AVG is 10 (10.5 truncated).
        self.log("loss", loss, sync_dist=True, on_step=True, on_epoch=True, batch_size=3 + RANK)
        # An integer metric (Lightning makes it a float before syncing) whose
        # average is not whole and goes negative: rank 0 logs -3(b+1), rank 1 2(b+1).
        self.log("int_metric", torch.tensor((5 * RANK - 3) * (batch_idx + 1), dtype=torch.int64),
                 sync_dist=True, on_step=True, on_epoch=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Record(Callback):
    def __init__(self):
        self.steps = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        m = trainer.callback_metrics
        self.steps.append({"loss_step": m["loss_step"].clone(), "int_metric": m["int_metric"].clone()})


def fit(backend: str, port: str) -> dict:
    os.environ["MASTER_PORT"] = port
    seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g))
    model, record = Model(), Record()
    trainer = Trainer(accelerator="cpu", devices=WORLD, num_nodes=1,
                      strategy=DDPStrategy(process_group_backend=backend), max_epochs=2, limit_train_batches=3,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=[record])
    trainer.fit(model, DataLoader(data, batch_size=4))
    assert dist.get_backend() == backend, dist.get_backend()
    # The call Lightning makes for the samples count, on its own: int64 AVG.
    count = _sync_ddp_if_available(torch.tensor(9 + 3 * RANK), reduce_op="mean")
    result = {"params": {k: v.detach().clone() for k, v in model.state_dict().items()}, "steps": record.steps,
              "loss_epoch": trainer.callback_metrics["loss_epoch"].clone(), "samples_avg": count}
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    gloo = fit("gloo", os.environ["MASTER_PORT"])
    fastpar = fit("fastpar", os.environ["MASTER_PORT_2"])
    # int64 AVG of 9 and 12: 10 both ways (gloo: the sum, then the float
    # quotient copied back into int64, truncating toward zero; fastpar:
    # NCCL's truncating division).
    for run in (gloo, fastpar):
        assert run["samples_avg"].dtype == torch.int64 and run["samples_avg"].item() == 10, run["samples_avg"]
    for b, step in enumerate(gloo["steps"][:3]):
        assert step["int_metric"].item() == -0.5 * (b + 1), (b, step["int_metric"])  # (-3 + 2)(b+1) / 2
    # Floats: gloo divides the sum by 2, fastpar averages with AVG: for 2
    # ranks both are (a + b) / 2 in float32, so bit for bit.
    same(fastpar, gloo, "Lightning parameters and synced metrics")
    print(f"rank {RANK}: Lightning fit on fastpar equals gloo", flush=True)
