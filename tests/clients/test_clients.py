"""Each client program runs on 2 CPU ranks, first on gloo and then on
fastpar, and every rank checks that fastpar gave gloo's results: bit for bit
(2 ranks: every reduction is a + b, whatever the order)."""
import pytest

from client_launch import run_client


@pytest.mark.parametrize("client", [
    "fsdp2_client.py",       # fully_shard training + full state dict through torch.distributed.checkpoint
    "dtensor_client.py",     # tensor + sequence parallel, redistribute, full_tensor
    "lightning_client.py",   # Trainer.fit, DDP, float and integer metrics with sync_dist=True
    "accelerate_client.py",  # Accelerator on a process group created as fastpar first
    "ddp_tools_client.py",   # channels_last DDP, ZeroRedundancyOptimizer, PowerSGD, Join, object collectives
    "c10d_extras_client.py",  # functional and autograd collectives, compiled DDP, subgroups, p2p, every reduction
])
def test_client_on_fastpar_equals_gloo(client, tmp_path):
    outs = run_client(client, tmp_path)
    for rank, out in enumerate(outs):
        assert f"rank {rank}: " in out and "equals gloo" in out, out
        assert "Traceback" not in out, out
