"""Data for the examples and the training benchmark, with no downloads.

* ``load_fashion_mnist(root)`` reads the four Fashion-MNIST IDX files
  (``train-images-idx3-ubyte`` etc., optionally ``.gz``) from a local folder.
* ``synthetic_fashion_like(...)`` makes a SYNTHETIC stand-in of the same
  shape (1x28x28 images, 10 classes): each class is a fixed random smooth
  pattern, each sample that pattern shifted by up to 2 pixels, scaled and
  drowned in noise, so a small CNN needs a few epochs to learn it. It is
  labelled as synthetic wherever it is used.
* ``load_data(path)`` picks the first when a path is given, else the second,
  and returns a description saying which one it is.
"""
from __future__ import annotations

import gzip
import os
import struct
from typing import NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F

_IDX_DTYPES = {0x08: torch.uint8, 0x09: torch.int8, 0x0B: torch.int16, 0x0C: torch.int32,
               0x0D: torch.float32, 0x0E: torch.float64}
FASHION_MEAN, FASHION_STD = 0.2860, 0.3530


class Split(NamedTuple):
    images: torch.Tensor  # float32 [N, 1, 28, 28], normalized
    labels: torch.Tensor  # int64 [N]


class Data(NamedTuple):
    train: Split
    test: Split
    description: str


def read_idx(path: str) -> torch.Tensor:
    """One IDX file (the MNIST format: magic, big-endian dims, raw data) as a tensor."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"fastpar.datasets.read_idx: {path} does not start with an IDX magic number")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        raise ValueError(f"fastpar.datasets.read_idx: {path} has IDX type code 0x{code:02x}, not one of "
                         f"{sorted(hex(c) for c in _IDX_DTYPES)}")
    dims = struct.unpack(f">{ndim}I", raw[4: 4 + 4 * ndim])
    dtype = _IDX_DTYPES[code]
    data = torch.frombuffer(bytearray(raw[4 + 4 * ndim:]), dtype=torch.uint8)
    if dtype != torch.uint8:
        data = data.view(dtype)
        if dtype.itemsize > 1:  # IDX is big-endian
            data = data.view(torch.uint8).view(-1, dtype.itemsize).flip(1).reshape(-1).view(dtype)
    expected = 1
    for d in dims:
        expected *= d
    if data.numel() != expected:
        raise ValueError(f"fastpar.datasets.read_idx: {path} holds {data.numel()} values but its header says "
                         f"{list(dims)} ({expected})")
    return data.reshape(dims).clone()


def _find(root: str, stem: str) -> str:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        p = os.path.join(root, name)
        if os.path.exists(p):
            return p
    raise FileNotFoundError(f"fastpar.datasets: no {stem}[.gz] in {root!r} (expected the four Fashion-MNIST "
                            f"IDX files: train-images-idx3-ubyte, train-labels-idx1-ubyte, "
                            f"t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte)")


def load_fashion_mnist(root: str) -> Tuple[Split, Split]:
    out = []
    for prefix in ("train", "t10k"):
        images = read_idx(_find(root, f"{prefix}-images-idx3-ubyte"))
        labels = read_idx(_find(root, f"{prefix}-labels-idx1-ubyte"))
        if images.dim() != 3 or images.shape[1:] != (28, 28) or labels.shape != images.shape[:1]:
            raise ValueError(f"fastpar.datasets: {prefix} images have shape {list(images.shape)} and labels "
                             f"{list(labels.shape)}; expected [N, 28, 28] and [N]")
        x = (images.float().div_(255).sub_(FASHION_MEAN).div_(FASHION_STD)).unsqueeze(1)
        out.append(Split(x, labels.long()))
    return out[0], out[1]


def synthetic_fashion_like(n_train: int = 12000, n_test: int = 2000, seed: int = 0,
                           noise: float = 3.0) -> Tuple[Split, Split]:
    """SYNTHETIC data shaped like Fashion-MNIST (see the module docstring)."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(10, 1, 7, 7, generator=g)
    protos = F.interpolate(coarse, size=(28, 28), mode="bilinear", align_corners=False)
    protos = (protos - protos.mean()) / protos.std()

    def make(n: int) -> Split:
        labels = torch.randint(0, 10, (n,), generator=g)
        x = protos[labels]
        shifts = torch.randint(-2, 3, (n, 2), generator=g)
        x = torch.stack([torch.roll(img, (int(s[0]), int(s[1])), dims=(1, 2)) for img, s in zip(x, shifts)])
        x = x * (0.6 + 0.8 * torch.rand(n, 1, 1, 1, generator=g)) + noise * torch.randn(x.shape, generator=g)
        # unit variance, like normalized Fashion-MNIST, so the same learning rates apply
        return Split((x / (1.0 + noise ** 2) ** 0.5).float(), labels)

    return make(n_train), make(n_test)


def load_data(path: Optional[str] = None, n_train: int = 12000, n_test: int = 2000) -> Data:
    """Fashion-MNIST from local IDX files when ``path`` is given, else synthetic data (labelled so)."""
    if path:
        train, test = load_fashion_mnist(path)
        return Data(train, test, f"Fashion-MNIST from {path} ({len(train.labels)} train / {len(test.labels)} test)")
    train, test = synthetic_fashion_like(n_train, n_test)
    return Data(train, test, f"SYNTHETIC Fashion-MNIST-shaped data ({n_train} train / {n_test} test; "
                             f"pass a folder of Fashion-MNIST IDX files for the real thing)")
