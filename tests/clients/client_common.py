"""What every client program shares: its rank, a fresh default process group
per backend, and the comparison of a fastpar run against the gloo run."""
from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

import fastpar  # noqa: F401  registers "fastpar" (an installed fastpar would not need this)

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
TMP = os.environ["CLIENT_TMP"]
BACKENDS = ("gloo", "fastpar")  # gloo first: the reference exists even when fastpar fails


_GROUPS = [0]  # groups this process has made: each rendezvous gets a file of its own


def init(backend: str) -> None:
    """The default group on `backend`, rendezvous through a file of its own:
    a FileStore file outlives its group until every rank has closed it, so a
    name used again could hand a rank the keys of the group before (a gloo
    address no longer listening)."""
    _GROUPS[0] += 1
    dist.init_process_group(backend, init_method=f"file://{TMP}/{backend}-{_GROUPS[0]}.store", rank=RANK,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    assert dist.get_backend() == backend, dist.get_backend()


def same(got, want, what: str, exact: bool = True, rtol: float = 0.0, atol: float = 0.0) -> None:
    """got == want, recursively over dicts, lists and tensors: bit for bit
    (exact), else within rtol/atol."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), f"{what}: keys {sorted(got)} != {sorted(want)}"
        for k in want:
            same(got[k], want[k], f"{what}.{k}", exact, rtol, atol)
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{what}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            same(g, w, f"{what}[{i}]", exact, rtol, atol)
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, \
            f"{what}: {got.dtype}{tuple(got.shape)} != {want.dtype}{tuple(want.shape)}"
        if exact:
            if not torch.equal(got, want):
                i = tuple((got != want).nonzero()[0].tolist()) if got.dim() else ()
                raise AssertionError(f"{what}: not bitwise equal; at {list(i)}: {got[i].item()} != {want[i].item()}")
        else:
            torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")
    else:
        assert got == want, f"{what}: {got!r} != {want!r}"


def run_both(run, what: str, **tolerance) -> dict:
    """run(backend) on gloo then on fastpar, each on a fresh default group;
    fastpar's results must equal gloo's (bitwise unless tolerance is given)."""
    results = {}
    for backend in BACKENDS:
        init(backend)
        try:
            results[backend] = run(backend)
            dist.barrier()
        finally:
            dist.destroy_process_group()
    same(results["fastpar"], results["gloo"], what, exact=not tolerance, **tolerance)
    print(f"rank {RANK}: {what} on fastpar equals gloo", flush=True)
    return results
