"""fastpar as a torch.distributed backend.

Importing fastpar registers the backend "fastpar" (CPU tensors), so that

    dist.init_process_group("fastpar")                 # or "cpu:fastpar,cuda:nccl"

works under torchrun, and DistributedDataParallel, dist.all_reduce and other
torch.distributed calls run on fastpar's shared-memory collectives.

registered_empty(shape, dtype, group) allocates a tensor inside this rank's
shared segment: all_reduce on it skips the copy into shared memory.
"""
from .backend import SEGMENT_PREFIX, create_backend, get_fastpar_backend, register, registered_empty

__all__ = ["SEGMENT_PREFIX", "create_backend", "get_fastpar_backend", "register", "registered_empty"]

register()
