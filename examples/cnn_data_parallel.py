"""A small CNN trained with fastpar.DataParallel on 32x32x3 batches.

Run from the repository root of a fresh clone:

    bash scripts/setup.sh                                   # once: .venv with torch, fastpar built in place
    .venv/bin/python examples/cnn_data_parallel.py              # 2 CPU "devices"
    .venv/bin/python examples/cnn_data_parallel.py --devices 0 1   # two GPUs

Any Python that has torch works too once the extension is built in place
(`python setup.py build_ext --inplace`): `PYTHONPATH=. python examples/...`.

The data is SYNTHETIC (random images whose class sets the mean of one colour
channel), enough to watch the loss fall. The last batch has 3 samples on
purpose: the wrapper splits it 2/1 and the step equals a single-device step.
"""
import argparse

import torch
import torch.nn.functional as F
from torch import nn

import fastpar


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int = 3):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 16x16
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 8x8
        )
        self.head = nn.Linear(32 * 8 * 8, num_classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def synthetic_batch(n: int, g: torch.Generator):
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randn(n, 3, 32, 32, generator=g)
    x[torch.arange(n), y] += 0.3  # the class slightly brightens its own channel
    return x, y


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", nargs="+", default=["cpu", "cpu"],
                    help='device ids: "cpu" (repeatable) or CUDA indices')
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--checkpoint", default="/tmp/fastpar_small_cnn.pt", help="where the state_dict is saved")
    args = ap.parse_args()
    devices = [int(d) if d.isdigit() else d for d in args.devices]
    torch.manual_seed(0)
    first = torch.device("cuda", devices[0]) if isinstance(devices[0], int) else torch.device(devices[0])
    model = fastpar.DataParallel(SmallCNN().to(first), device_ids=devices)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        n = 3 if step == args.steps - 1 else 32  # an uneven last batch
        x, y = synthetic_batch(n, g)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y.to(model.output_device))
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  batch {n:2d}  loss {loss.item():.4f}")
    x, y = synthetic_batch(256, g)
    with torch.no_grad():
        acc = (model(x).argmax(1).cpu() == y).float().mean().item()
    print(f"accuracy on 256 fresh samples: {100 * acc:.1f}% (devices {model.device_ids})")
    torch.save(model.state_dict(), args.checkpoint)  # plain keys: loads into SmallCNN()
    SmallCNN().load_state_dict(torch.load(args.checkpoint))
    print(f"checkpoint {args.checkpoint} loads into a bare SmallCNN")


if __name__ == "__main__":
    main()
