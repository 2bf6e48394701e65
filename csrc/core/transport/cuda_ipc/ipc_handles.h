// CUDA IPC plumbing: allocate an arena, export it, map peers' arenas, unmap.
// Handles are 64 opaque bytes (cudaIpcMemHandle_t) that the caller exchanges
// through whatever rendezvous it has (a torch.distributed Store, a file).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace fastpar {
namespace cuda_ipc {

// cudaMalloc an arena for `slot_bytes` per slot and `registered_bytes` of
// registered buffers on the current device and zero its header (flag 0 = no
// phase posted yet, abort 0, status 0). A dedicated cudaMalloc, not a
// caching-allocator block: an IPC handle names a whole allocation, and the
// arena must outlive any tensor.
cudaError_t arena_alloc(size_t slot_bytes, size_t registered_bytes, void** base);
cudaError_t arena_free(void* base);

cudaError_t export_handle(void* base, cudaIpcMemHandle_t* handle);

// Maps a peer's arena into this process. cudaIpcMemLazyEnablePeerAccess
// enables peer access to the owning device if it is not enabled yet.
cudaError_t open_handle(const cudaIpcMemHandle_t& handle, void** base);
cudaError_t close_handle(void* base);

}  // namespace cuda_ipc
}  // namespace fastpar
