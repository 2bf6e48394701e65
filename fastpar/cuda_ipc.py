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
    `store`, waits for every rank's handle and maps the peers' arenas. The
    same ranks may connect again under the same prefix (after close): each
    connect has keys of its own."""
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    comm = torch.classes.fastpar.CudaIpcComm(rank, world_size, index, slot_bytes)
    handles = _exchange(store, prefix, "handle", rank, world_size, bytes(comm.handle().tolist()))
    comm.connect(torch.stack([torch.tensor(list(h), dtype=torch.uint8) for h in handles]))
    return comm


def close(comm, store, rank, world_size, prefix="fastpar/cuda_ipc"):
    """Unmaps and frees once every rank is done: a peer may read this rank's
    arena until it has finished its own last call."""
    comm.synchronize()
    _exchange(store, prefix, "done", rank, world_size, b"1")
    comm.close()


def _generation(store, prefix, round_name, world_size):
    """The how-many-th `round_name` round under `prefix` this is (0, 1, ...),
    equal on every rank without a message: each rank adds 1 to one counter,
    and no rank can start round g + 1 before every rank has added for round g
    (round g ends with waiting for every rank's key, published after its
    add), so round g's adds return g * world_size + 1 .. (g + 1) * world_size.
    Fixed keys would not do: a second connect would read the first one's
    handles, and a second close would pass its barrier on the first one's
    keys, freeing an arena a peer still reads."""
    return (store.add(f"{prefix}/{round_name}/count", 1) - 1) // world_size


def _round_keys(prefix, round_name, generation, world_size):
    return [f"{prefix}/{round_name}/{generation}/{r}" for r in range(world_size)]


def _exchange(store, prefix, round_name, rank, world_size, value):
    """Publishes `value` for this rank's next `round_name` round and returns
    every rank's value of that round, in rank order (waiting for them)."""
    keys = _round_keys(prefix, round_name, _generation(store, prefix, round_name, world_size), world_size)
    store.set(keys[rank], value)
    store.wait(keys)
    return [store.get(k) for k in keys]
