"""LeNet with fastpar.DistributedDataParallel and a DistributedSampler, launched by torchrun.

Run from the repository root of a fresh clone:

    bash scripts/setup.sh                                   # once: .venv with torch, fastpar built in place
    .venv/bin/torchrun --standalone --nproc_per_node=2 examples/ddp_torchrun.py
    .venv/bin/torchrun --standalone --nproc_per_node=2 examples/ddp_torchrun.py --data ~/fashion-mnist

Any torchrun works too once the extension is built in place
(`python setup.py build_ext --inplace`): prefix `PYTHONPATH=.`.

(`python -m torch.distributed.run` works where the torchrun script is not on PATH.)
The backend is "fastpar" (--backend gloo to compare; on GPUs --backend nccl).
Without --data the images are
SYNTHETIC (benchmarks/training/datasets.py); nothing is downloaded.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import fastpar
# the LeNet, data and training helpers the benchmarks share (benchmarks/training/)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from training.datasets import load_data
from training.lenet import accuracy, lenet


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=None, help="folder with the Fashion-MNIST IDX files")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    ap.add_argument("--backend", default="fastpar", help="fastpar (default), gloo, or nccl on GPUs")
    ap.add_argument("--train-samples", type=int, default=12000,
                    help="synthetic training samples (with --data: all of them)")
    args = ap.parse_args()
    backend = args.backend
    dist.init_process_group(backend)  # torchrun provides RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend == "nccl" else torch.device("cpu")
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    data = load_data(args.data, n_train=args.train_samples, n_test=2000)
    if rank == 0:
        print(f"data: {data.description}; backend {backend}, {world} ranks")
    train = TensorDataset(*data.train)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch, sampler=sampler)
    torch.manual_seed(rank)  # different on purpose: construction broadcasts rank 0's parameters
    model = fastpar.DistributedDataParallel(lenet().to(device),
                                            device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        start, seen = time.perf_counter(), 0
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(model(x), y.to(device)).backward()
            opt.step()
            seen += len(y)
        took = time.perf_counter() - start
        if rank == 0:
            acc = accuracy(model.module, data.test.images.to(device), data.test.labels.to(device))
            print(f"epoch {epoch + 1}: test accuracy {100 * acc:.2f}%, {world * seen / took:.0f} samples/s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
