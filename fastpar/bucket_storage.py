"""Where gradient buckets live: the one place that decides it.

fastpar.DistributedDataParallel and fastpar.comm_hook allocate every flat
bucket through ``allocate_bucket_storage``. When the process group runs the
fastpar backend, buckets are ``fastpar.distributed.registered_empty`` tensors
where that is possible: CPU buckets in the backend's shared memory (an
all_reduce of 16 MiB or more needs no copy in), CUDA buckets in the CUDA IPC
arena when it has a registered region (FASTPAR_CUDA_IPC_REGISTERED_BYTES;
all_reduce above the one-shot sizes needs no copy in). Allocating one is
collective over the group, so every rank must allocate the same buckets in the
same order; a CUDA arena without room for a bucket says so on every rank, and
that bucket becomes an ordinary tensor everywhere. Otherwise, as on gloo or
NCCL, buckets are ordinary zero-filled tensors. Either way the result is a
plain 1-D tensor that torch.distributed collectives accept, so callers never
branch.
"""
from __future__ import annotations

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


def allocate_bucket_storage(numel: int, dtype: torch.dtype, device: torch.device,
                            process_group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """A 1-D tensor of ``numel`` elements for one gradient bucket, zero-filled:
    registered storage where the fastpar backend has it (see the module's
    docstring), ``torch.zeros`` otherwise."""
    # Collective where registered: every rank allocates its buckets in the same order (same model, same bucketing).
    if device.type == "cpu" and uses_fastpar_backend(process_group, "cpu"):
        return registered_empty((numel,), dtype, group=process_group).zero_()
    if device.type == "cuda" and _registered_cuda(process_group):
        try:
            return registered_empty((numel,), dtype, group=process_group, device=device).zero_()
        except ValueError as e:
            if "do not fit" not in str(e):
                raise
            # No room on any rank (the ranks agreed on that): an ordinary tensor on every rank.
    return torch.zeros(numel, dtype=dtype, device=device)


def storage_kind(process_group: Optional[dist.ProcessGroup], device: torch.device) -> str:
    """'registered' or 'torch.empty': what allocate_bucket_storage gives here
    (for reports; a CUDA arena that runs out still gives ordinary tensors)."""
    if device.type == "cpu" and uses_fastpar_backend(process_group, "cpu"):
        return "registered"
    if device.type == "cuda" and _registered_cuda(process_group):
        return "registered"
    return "torch.empty"
