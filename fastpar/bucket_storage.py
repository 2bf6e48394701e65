"""Where gradient buckets live: the one place that decides it.

fastpar.DistributedDataParallel and fastpar.comm_hook allocate every flat
bucket through ``allocate_bucket_storage``. When the process group runs the
fastpar backend, buckets are ``fastpar.distributed.registered_empty`` tensors
(placed in the backend's shared memory, so an all_reduce of 16 MiB or more
needs no copy in;
allocating one is collective over the group, so every rank must allocate the
same buckets in the same order); otherwise, as on gloo or NCCL, they are
ordinary zero-filled tensors. Either way the result is a plain
1-D tensor that torch.distributed collectives accept, so callers never branch.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from .distributed import registered_empty


def uses_fastpar_backend(process_group: Optional[dist.ProcessGroup]) -> bool:
    try:
        return str(dist.get_backend(process_group)).lower() == "fastpar"
    except (RuntimeError, ValueError):
        return False


def allocate_bucket_storage(numel: int, dtype: torch.dtype, device: torch.device,
                            process_group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """A 1-D tensor of ``numel`` elements for one gradient bucket, zero-filled.
    Registered (shared-memory) storage on the fastpar backend for CPU buckets,
    ``torch.zeros`` otherwise."""
    if device.type == "cpu" and uses_fastpar_backend(process_group):
        # Collective: every rank allocates its buckets in the same order (same model, same bucketing).
        return registered_empty((numel,), dtype, group=process_group).zero_()
    return torch.zeros(numel, dtype=dtype, device=device)


def storage_kind(process_group: Optional[dist.ProcessGroup], device: torch.device) -> str:
    """'registered' or 'torch.empty': what allocate_bucket_storage gives here (for reports)."""
    if device.type == "cpu" and uses_fastpar_backend(process_group):
        return "registered"
    return "torch.empty"
