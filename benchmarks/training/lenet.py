"""LeNet-5 for 1x28x28 inputs (Fashion-MNIST), the model of the examples and
of the training benchmark; ReLU and max pooling rather than the 1998 sigmoids,
so a few epochs suffice."""
import torch
from torch import nn


def lenet(num_classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 6, kernel_size=5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, kernel_size=5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, num_classes),
    )


@torch.no_grad()
def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch: int = 1000) -> float:
    was_training = model.training
    model.eval()
    correct = 0
    for i in range(0, len(labels), batch):
        correct += (model(images[i: i + batch]).argmax(1) == labels[i: i + batch]).sum().item()
    model.train(was_training)
    return correct / max(1, len(labels))
