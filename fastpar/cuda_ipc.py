"""Rendezvous for torch.classes.fastpar.CudaIpcComm (multi-process allreduce
over CUDA IPC, one GPU per process) through a torch.distributed Store.

    comm = fastpar.cuda_ipc.connect(store, rank, world_size, device)
    comm.allreduce_(tensor, op, "auto")   # enqueued on the current stream
    comm.check()                          # synchronizes; raises if a peer failed
    fastpar.cuda_ipc.close(comm, store, rank, world_size)

Every rank must make the same calls in the same order (same numel, dtype, op,
algorithm); a rank that does not is reported by check() on every rank.
"""
import torch

__all__ = ["connect", "close", "DEFAULT_SLOT_BYTES"]

# Per-rank slot size: messages larger than a slot go through it in chunks.
# Same as cuda_ipc::kDefaultSlotBytes (allreduce_ipc.h, which says why 8 MiB);
# the arena is three slots plus a header.
DEFAULT_SLOT_BYTES = 8 << 20


def connect(store, rank, world_size, device, slot_bytes=DEFAULT_SLOT_BYTES, prefix="fastpar/cuda_ipc"):
    """Creates this rank's arena, publishes its IPC handle under `prefix` in
    `store`, waits for every rank's handle and maps the peers' arenas."""
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    comm = torch.classes.fastpar.CudaIpcComm(rank, world_size, index, slot_bytes)
    store.set(f"{prefix}/handle/{rank}", bytes(comm.handle().tolist()))
    keys = [f"{prefix}/handle/{r}" for r in range(world_size)]
    store.wait(keys)
    rows = [torch.tensor(list(store.get(k)), dtype=torch.uint8) for k in keys]
    comm.connect(torch.stack(rows))
    return comm


def close(comm, store, rank, world_size, prefix="fastpar/cuda_ipc"):
    """Unmaps and frees once every rank is done: a peer may read this rank's
    arena until it has finished its own last call."""
    comm.synchronize()
    store.set(f"{prefix}/done/{rank}", b"1")
    store.wait([f"{prefix}/done/{r}" for r in range(world_size)])
    comm.close()
