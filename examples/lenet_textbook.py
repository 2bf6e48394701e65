"""LeNet on Fashion-MNIST, data parallel "from scratch", the textbook way
(parameters copied to every device by hand, a hand-written training step) with
fastpar.scatter splitting the batch and fastpar.allreduce summing gradients,
where the textbook writes its own `split_batch` and `allreduce` loops.

Run from the repository root of a fresh clone:

    bash scripts/setup.sh                                   # once: .venv with torch, fastpar built in place
    .venv/bin/python examples/lenet_textbook.py                        # 2 CPU "devices", synthetic data
    .venv/bin/python examples/lenet_textbook.py --data ~/fashion-mnist  # the four IDX files, read locally
    .venv/bin/python examples/lenet_textbook.py --devices 0 1          # two GPUs

Any Python that has torch works too once the extension is built in place
(`python setup.py build_ext --inplace`): `PYTHONPATH=. python examples/...`.

Without --data the images are SYNTHETIC (benchmarks/training/datasets.py; nothing is downloaded).
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

import fastpar
# the LeNet, data and training helpers the benchmarks share (benchmarks/training/)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from training.datasets import load_data


def init_params(seed: int = 0):
    """He initialisation (the textbook's fixed 0.01 scale needs ~10 epochs to get going)."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(20, 1, 3, 3), (20,), (50, 20, 5, 5), (50,), (800, 128), (128,), (128, 10), (10,)]
    params = []
    for s in shapes:
        fan_in = s[0] if len(s) == 2 else (s[1] * s[2] * s[3] if len(s) == 4 else 0)
        params.append(torch.randn(s, generator=g) * (2.0 / fan_in) ** 0.5 if fan_in else torch.zeros(s))
    return params


def lenet(X, params):
    h1 = F.avg_pool2d(F.relu(F.conv2d(X, params[0], params[1])), 2, 2)   # 20 x 13 x 13
    h2 = F.avg_pool2d(F.relu(F.conv2d(h1, params[2], params[3])), 2, 2)  # 50 x 4 x 4
    h3 = F.relu(h2.reshape(h2.shape[0], -1) @ params[4] + params[5])
    return h3 @ params[6] + params[7]


def get_params(params, device):
    """One copy of the parameters per device (CPU devices get separate copies too)."""
    return [p.to(device, copy=True).requires_grad_() for p in params]


def train_batch(X, y, device_params, devices, lr):
    # textbook: split_batch(X, y, devices) with its own loop; here one fastpar.scatter per tensor
    X_shards = fastpar.scatter(X, devices)
    y_shards = fastpar.scatter(y, devices)
    ls = [F.cross_entropy(lenet(Xs, ps), ys, reduction="sum")
          for Xs, ys, ps in zip(X_shards, y_shards, device_params)]
    for loss in ls:
        loss.backward()
    with torch.no_grad():
        for i in range(len(device_params[0])):
            # textbook: allreduce([params[i].grad for params in device_params]) written as copy loops
            fastpar.allreduce([ps[i].grad for ps in device_params])
        for ps in device_params:  # plain SGD on every copy: they stay identical
            for p in ps:
                p -= lr * p.grad / X.shape[0]
                p.grad.zero_()


def evaluate(params, images, labels, device):
    with torch.no_grad():
        pred = lenet(images.to(device), params).argmax(1).cpu()
    return (pred == labels).float().mean().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", nargs="+", default=["cpu", "cpu"])
    ap.add_argument("--data", default=None, help="folder with the Fashion-MNIST IDX files")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--train-samples", type=int, default=6000,
                    help="synthetic training samples (with --data: all of them)")
    args = ap.parse_args()
    devices = [torch.device("cuda", int(d)) if d.isdigit() else torch.device(d) for d in args.devices]
    data = load_data(args.data, n_train=args.train_samples, n_test=2000)
    print(f"data: {data.description}")
    device_params = [get_params(init_params(), d) for d in devices]
    X_all, y_all = data.train
    for epoch in range(args.epochs):
        start = time.perf_counter()
        perm = torch.randperm(len(y_all), generator=torch.Generator().manual_seed(epoch))
        for i in range(0, len(y_all), args.batch):
            idx = perm[i:i + args.batch]
            train_batch(X_all[idx], y_all[idx], device_params, devices, args.lr)
        acc = evaluate(device_params[0], *data.test, devices[0])
        print(f"epoch {epoch + 1}: test accuracy {100 * acc:.2f}%, {time.perf_counter() - start:.1f} s "
              f"on {len(devices)} devices")
    same = all(torch.equal(p, q) for ps in device_params[1:] for p, q in zip(ps, device_params[0]))
    print(f"parameter copies identical on every device: {same}")
    if not same:
        sys.exit("the copies diverged: the allreduce did not give every device the same gradients")


if __name__ == "__main__":
    main()
