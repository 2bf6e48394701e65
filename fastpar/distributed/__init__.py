"""fastpar as a torch.distributed backend.

Importing fastpar registers the backend "fastpar" for CPU and CUDA tensors, so that

    dist.init_process_group("fastpar")        # = "cpu:fastpar,cuda:fastpar"; or "cpu:fastpar,cuda:nccl"

works under torchrun, and DistributedDataParallel, dist.all_reduce and other
torch.distributed calls run on fastpar:

- CPU tensors: fastpar's shared-memory collectives (gloo between hosts);
- CUDA tensors (CUDA builds with a GPU, see cuda_supported()): every
  collective and send/recv over CUDA IPC among the ranks of one host (ranks
  may share a GPU), NCCL above FASTPAR_CUDA_IPC_MAX_BYTES on distinct GPUs,
  and NCCL between hosts' leaders when the group spans hosts. Without CUDA
  support, CUDA tensors get an error (use "cpu:fastpar,cuda:nccl"). Details:
  docs/cuda.md.

registered_empty(shape, dtype, group, device) allocates a tensor inside memory
every peer maps (the shared segment on the CPU, the CUDA IPC arena on a GPU):
all_reduce on it skips the copy into shared memory (CPU: 16 MiB or more,
FASTPAR_SHM_REGISTERED_MIN_BYTES, where the group measured that faster;
CUDA: above the one-shot sizes).

all_reduce / broadcast / all_gather_into_tensor (direct.py): the same
collectives as dist.*, synchronous, without torch.distributed's per-call path.
"""
from .backend import (
    SEGMENT_PREFIX,
    binding_report,
    core_binding,
    create_backend,
    cuda_supported,
    get_fastpar_backend,
    placement,
    register,
    registered_empty,
)
from .direct import all_gather_into_tensor, all_reduce, broadcast

__all__ = ["SEGMENT_PREFIX", "all_gather_into_tensor", "all_reduce", "binding_report", "broadcast", "core_binding",
           "create_backend", "cuda_supported",
           "get_fastpar_backend", "placement", "register", "registered_empty"]

register()
