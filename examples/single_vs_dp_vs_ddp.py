"""The same LeNet training three ways, and proof that they agree:

  1. one device, the whole batch;
  2. fastpar.DataParallel over N CPU "devices" in this process;
  3. fastpar.DistributedDataParallel over N processes started by
     torch.multiprocessing.spawn, on the fastpar backend.

Run from the repository root of a fresh clone:

    bash scripts/setup.sh                                   # once: .venv with torch, fastpar built in place
    .venv/bin/python examples/single_vs_dp_vs_ddp.py            # N = 2
    .venv/bin/python examples/single_vs_dp_vs_ddp.py --world 3 --steps 20

Any Python that has torch works too once the extension is built in place
(`python setup.py build_ext --inplace`): `PYTHONPATH=. python examples/...`.

Data: SYNTHETIC Fashion-MNIST-shaped images (benchmarks/training/datasets.py). The global
batch of 50 does not divide by 3 on purpose: DataParallel splits it 17/17/16
and still matches; DDP ranks weight their losses by their share of the batch.
"""
import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import fastpar
# the LeNet, data and training helpers the benchmarks share (benchmarks/training/)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from training.datasets import synthetic_fashion_like
from training.lenet import lenet


def batches(steps: int, batch: int):
    train, _ = synthetic_fashion_like(n_train=steps * batch, n_test=1)
    return [(train.images[i * batch:(i + 1) * batch], train.labels[i * batch:(i + 1) * batch]) for i in range(steps)]


def make():
    torch.manual_seed(0)
    model = lenet()
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def train_single(data):
    model, opt = make()
    for x, y in data:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def train_data_parallel(data, world):
    net, _ = make()
    model = fastpar.DataParallel(net, device_ids=["cpu"] * world)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in data:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return net


def ddp_worker(rank, world, data, folder):
    torch.set_num_threads(1)
    backend = "fastpar"
    dist.init_process_group(backend, store=dist.FileStore(os.path.join(folder, "store"), world),
                            rank=rank, world_size=world)
    net, _ = make()
    model = fastpar.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in data:
        n = x.size(0)
        sizes = [n // world + (1 if r < n % world else 0) for r in range(world)]
        start = sum(sizes[:rank])
        xs, ys = x[start:start + sizes[rank]], y[start:start + sizes[rank]]
        opt.zero_grad()
        # DDP averages over ranks; weighting by this rank's share of the batch
        # makes the result the mean over the global batch even when shares differ.
        (F.cross_entropy(model(xs), ys) * (world * sizes[rank] / n)).backward()
        opt.step()
    torch.save({"params": [p.detach() for p in net.parameters()], "backend": backend},
               os.path.join(folder, f"rank{rank}.pt"))
    dist.destroy_process_group()


def max_diff(a, b):
    return max((p.detach() - q.detach()).abs().max().item() for p, q in zip(a, b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=50)
    args = ap.parse_args()
    data = batches(args.steps, args.batch)
    single = list(train_single(data).parameters())
    dp = list(train_data_parallel(data, args.world).parameters())
    folder = tempfile.mkdtemp(prefix="fastpar_example_")
    mp.spawn(ddp_worker, args=(args.world, data, folder), nprocs=args.world)
    ranks = [torch.load(os.path.join(folder, f"rank{r}.pt")) for r in range(args.world)]
    print(f"{args.steps} SGD steps of LeNet on a global batch of {args.batch}, {args.world} replicas/ranks")
    print(f"  DataParallel vs one device:      max |param diff| = {max_diff(dp, single):.2e}")
    print(f"  DDP ({ranks[0]['backend']}) vs one device:       max |param diff| = "
          f"{max_diff(ranks[0]['params'], single):.2e}")
    same = all(torch.equal(p, q) for r in ranks[1:] for p, q in zip(r["params"], ranks[0]["params"]))
    print(f"  DDP ranks bitwise identical:     {same}")
    # float32 sums in another order differ in the last bits; a wrong gradient differs by far more
    worst = max(max_diff(dp, single), max_diff(ranks[0]["params"], single))
    if not same or worst > 1e-4:
        sys.exit(f"the three trainings disagree (max |param diff| {worst:.2e}, ranks identical: {same})")


if __name__ == "__main__":
    main()
