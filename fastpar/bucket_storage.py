"""Where gradient buckets live: the one place that decides it.

fastpar.DistributedDataParallel and fastpar.comm_hook allocate every flat
bucket through ``allocate_bucket_storage``. When the process group runs the
fastpar backend, buckets are ``fastpar.distributed.registered_empty`` tensors
where that is possible: CPU buckets in the backend's shared memory (an
all_reduce of 16 MiB or more needs no copy in), CUDA buckets in the CUDA IPC
arena when it has a registered region (FASTPAR_CUDA_IPC_REGISTERED_BYTES;
all_reduce above the one-shot sizes needs no copy in). Allocating one is
collective over the group, so every rank must allocate the same buckets in the
same order; a registered region without room for a bucket (the CPU segment's
region full, or /dev/shm too small to back it; a CUDA arena full) says so on
every rank, and that bucket becomes an ordinary tensor everywhere, with one
warning per process. Otherwise, as on gloo or
NCCL, buckets are ordinary zero-filled tensors. Either way the result is a
plain 1-D tensor that torch.distributed collectives accept, so callers never
branch.
"""
from __future__ import annotations

import warnings
import weakref
from typing import Optional

import torch
import torch.distributed as dist

from . import _C
from .distributed import get_fastpar_backend, registered_empty


def uses_fastpar_backend(process_group: Optional[dist.ProcessGroup], device_type: str = "cpu") -> bool:
    """Whether the group runs fastpar for tensors on `device_type`: "fastpar",
    and mixed strings such as "cpu:fastpar,cuda:fastpar" or "cpu:fastpar,cuda:nccl"
    (dist.get_backend gives the whole string for those)."""
    try:
        get_fastpar_backend(process_group, device_type)
        return True
    except (RuntimeError, TypeError, ValueError):  # no group, none for that device, or not fastpar
        return False


def _registered_cuda(process_group: Optional[dist.ProcessGroup]) -> bool:
    """Whether the group's CUDA tensors can be registered: a one-host fastpar
    CUDA backend whose arena has a registered region."""
    if not uses_fastpar_backend(process_group, "cuda"):
        return False
    cuda = get_fastpar_backend(process_group, "cuda").cuda_engine
    engine_type = getattr(_C, "CudaEngine", None)  # CUDA builds only
    return engine_type is not None and isinstance(cuda, engine_type) and cuda.registered_bytes > 0


# Groups where a bucket did not fit in registered memory (storage_kind says so).
_fell_back: "weakref.WeakSet" = weakref.WeakSet()
_warned = False


def _no_room(error: ValueError, device: torch.device, process_group) -> None:
    """Records that a bucket became an ordinary tensor, warning once per process."""
    global _warned
    pg = process_group if process_group is not None else dist.group.WORLD
    if pg is not None:
        _fell_back.add(pg)
    if not _warned:
        _warned = True
        warnings.warn(f"fastpar: gradient buckets on {device.type} fall back to ordinary tensors (all_reduce then "
                      f"copies them into shared memory): {error}", RuntimeWarning, stacklevel=3)


def _fell_back_on(process_group) -> bool:
    pg = process_group if process_group is not None else dist.group.WORLD
    return pg is not None and pg in _fell_back


def allocate_bucket_storage(numel: int, dtype: torch.dtype, device: torch.device,
                            process_group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """A 1-D tensor of ``numel`` elements for one gradient bucket, zero-filled:
    registered storage where the fastpar backend has room for it (see the
    module's docstring), ``torch.zeros`` otherwise."""
    # Collective where registered: every rank allocates its buckets in the same order (same model, same bucketing).
    registered = ((device.type == "cpu" and uses_fastpar_backend(process_group, "cpu"))
                  or (device.type == "cuda" and _registered_cuda(process_group)))
    if registered:
        try:
            return registered_empty((numel,), dtype, group=process_group, device=device).zero_()
        except ValueError as e:
            # "do not fit": no room on some rank, and every rank raised it (the
            # allocation is agreed on), so every rank takes an ordinary tensor.
            if "do not fit" not in str(e):
                raise
            _no_room(e, device, process_group)
    return torch.zeros(numel, dtype=dtype, device=device)


def storage_kind(process_group: Optional[dist.ProcessGroup], device: torch.device) -> str:
    """'registered' or 'torch.empty': what allocate_bucket_storage gives here
    ('torch.empty' once a bucket of the group did not fit in registered memory)."""
    if _fell_back_on(process_group):
        return "torch.empty"
    if device.type == "cpu" and uses_fastpar_backend(process_group, "cpu"):
        return "registered"
    if device.type == "cuda" and _registered_cuda(process_group):
        return "registered"
    return "torch.empty"
