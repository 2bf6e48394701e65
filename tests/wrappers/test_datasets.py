"""The IDX reader and the data loader used by the examples (no downloads)."""
import gzip
import struct

import pytest
import torch
from bench_import import benchmark_module

load_data, read_idx, synthetic_fashion_like = (getattr(benchmark_module("training.datasets"), f)
                                              for f in ("load_data", "read_idx", "synthetic_fashion_like"))


def write_idx(path, t: torch.Tensor, code=0x08):
    header = bytes([0, 0, code, t.dim()]) + struct.pack(f">{t.dim()}I", *t.shape)
    body = t.numpy().astype(">i4" if code == 0x0C else "u1").tobytes()
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(header + body)


def test_reads_fashion_mnist_idx_files_gzipped_or_not(tmp_path):
    g = torch.Generator().manual_seed(0)
    for prefix, n, gz in (("train", 5, ".gz"), ("t10k", 3, "")):
        write_idx(str(tmp_path / f"{prefix}-images-idx3-ubyte{gz}"), torch.randint(0, 256, (n, 28, 28), generator=g))
        write_idx(str(tmp_path / f"{prefix}-labels-idx1-ubyte{gz}"), torch.randint(0, 10, (n,), generator=g))
    data = load_data(str(tmp_path))
    assert data.train.images.shape == (5, 1, 28, 28) and data.test.labels.shape == (3,)
    assert data.train.labels.dtype == torch.int64 and "Fashion-MNIST" in data.description
    raw = read_idx(str(tmp_path / "t10k-labels-idx1-ubyte"))
    assert torch.equal(raw.long(), data.test.labels)


def test_big_endian_int32_and_bad_files(tmp_path):
    t = torch.tensor([[1, -2], [70000, 3]], dtype=torch.int32)
    write_idx(str(tmp_path / "x.idx"), t, code=0x0C)
    assert torch.equal(read_idx(str(tmp_path / "x.idx")), t)
    (tmp_path / "bad").write_bytes(b"\x01\x02\x08\x01")
    with pytest.raises(ValueError, match="IDX magic"):
        read_idx(str(tmp_path / "bad"))
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
        load_data(str(tmp_path))


def test_synthetic_data_is_labelled_deterministic_and_unit_scale():
    a, _ = synthetic_fashion_like(200, 10)
    b, _ = synthetic_fashion_like(200, 10)
    assert torch.equal(a.images, b.images) and set(a.labels.tolist()) <= set(range(10))
    assert 0.8 < a.images.std().item() < 1.2
    assert "SYNTHETIC" in load_data(None, 100, 10).description
