"""fastpar.comm_hook: a communication hook for stock
torch.nn.parallel.DistributedDataParallel.

    ddp = torch.nn.parallel.DistributedDataParallel(net)
    ddp.register_comm_hook(state=None, hook=fastpar.comm_hook)   # state: a process group or None

Each bucket stock DDP hands over is averaged over the ranks of ``state`` (a
ProcessGroup; None means the default group):

* fastpar backend with registered buffers (``fastpar.distributed.registered_empty``):
  CPU buckets are copied into a registered shared-memory buffer kept per
  bucket, all_reduced there in place, and that buffer is returned; DDP reads
  the averaged gradients from it.
* CUDA buckets, any other backend (gloo, NCCL), or no registered buffers:
  the bucket itself is all_reduced in place and divided by the world size,
  exactly what torch's default allreduce hook does, so registering the hook
  never changes results.
"""

from typing import Dict, Optional, Tuple

import torch
import torch.distributed as dist

from .bucket_storage import allocate_bucket_storage, storage_kind

__all__ = ["comm_hook"]

# Registered staging buffers, reused across steps: (group id, bucket index, numel, dtype) -> tensor.
# Stock DDP finishes reading a hook's result before the next backward starts, so reuse is safe.
_staging: Dict[Tuple[int, int, int, torch.dtype], torch.Tensor] = {}


def _group(state: object) -> Optional[dist.ProcessGroup]:
    if state is None or isinstance(state, dist.ProcessGroup):
        return state
    group = getattr(state, "process_group", None)
    if group is None or isinstance(group, dist.ProcessGroup):
        return group
    raise TypeError(f"fastpar.comm_hook: state must be a ProcessGroup, None or an object with a "
                    f"process_group attribute, got {type(state).__name__}")


def comm_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    group = _group(state)
    world = dist.get_world_size(group)
    buf = bucket.buffer()
    target = buf
    # CPU only: on CUDA the copy into a registered buffer would cost what the
    # zero-copy schedule saves (the IPC schedules copy the bucket in anyway).
    if buf.device.type == "cpu" and storage_kind(group, buf.device) == "registered":
        key = (id(group), bucket.index(), buf.numel(), buf.dtype)
        staged = _staging.get(key)
        if staged is None:
            # Stock DDP rebuilds its buckets once after the first step: let the
            # old buffer of this bucket index go back to the shared arena.
            for old in [k for k in _staging if k[:2] == key[:2]]:
                del _staging[old]
            staged = _staging[key] = allocate_bucket_storage(buf.numel(), buf.dtype, buf.device, group)
        staged.copy_(buf)
        target = staged
    work = dist.all_reduce(target, op=dist.ReduceOp.SUM, group=group, async_op=True)

    def average(fut: torch.futures.Future) -> torch.Tensor:
        return fut.value()[0].div_(world)

    return work.get_future().then(average)
