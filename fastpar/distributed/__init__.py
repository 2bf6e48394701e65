"""fastpar as a torch.distributed backend.

Importing fastpar registers the backend "fastpar" for CPU and CUDA tensors, so that

    dist.init_process_group("fastpar")        # = "cpu:fastpar,cuda:fastpar"; or "cpu:fastpar,cuda:nccl"

works under torchrun, and DistributedDataParallel, dist.all_reduce and other
torch.distributed calls run on fastpar:

- CPU tensors: fastpar's shared-memory collectives (gloo between hosts);
- CUDA tensors (CUDA builds with a GPU, see cuda_supported()): all_reduce over
  CUDA IPC when every rank can map every peer's GPU and the tensor is at most
  FASTPAR_CUDA_IPC_MAX_BYTES (8 MiB); larger tensors, every other collective
  and ranks on several hosts go to NCCL. Without CUDA support, CUDA tensors
  get an error (use "cpu:fastpar,cuda:nccl"). Details: docs/cuda.md.

registered_empty(shape, dtype, group) allocates a tensor inside this rank's
shared segment: all_reduce on it (16 MiB or more, FASTPAR_SHM_REGISTERED_MIN_BYTES)
skips the copy into shared memory.

all_reduce / broadcast / all_gather_into_tensor (direct.py): the same
collectives as dist.*, synchronous, without torch.distributed's per-call path.
"""
from .backend import (
    SEGMENT_PREFIX,
    core_binding,
    create_backend,
    cuda_supported,
    get_fastpar_backend,
    register,
    registered_empty,
)
from .direct import all_gather_into_tensor, all_reduce, broadcast

__all__ = ["SEGMENT_PREFIX", "all_gather_into_tensor", "all_reduce", "broadcast", "core_binding", "create_backend",
           "cuda_supported",
           "get_fastpar_backend", "register", "registered_empty"]

register()
