#include "ipc_handles.h"

#include "../cuda_p2p/cuda_try.h"
#include "ipc_arena.h"

namespace fastpar {
namespace cuda_ipc {

cudaError_t arena_alloc(size_t slot_bytes, size_t registered_bytes, void** base) {
  *base = nullptr;
  void* p = nullptr;
  FASTPAR_CUDA_TRY(cudaMalloc(&p, arena_bytes(slot_bytes, registered_bytes)));
  // Synchronous on purpose: the header must read as zero before the handle is
  // handed to any peer, whose first wait reads our flag.
  // The p2p counters too: a peer's first credit/wait reads them.
  cudaError_t err = cudaMemset(p, 0, kHeaderBytes);
  if (err == cudaSuccess) err = cudaMemset(p2p_control_of(p, slot_bytes), 0, kP2PControlBytes);
  if (err == cudaSuccess) err = cudaMemset(graph_control_of(p, slot_bytes), 0, kGraphControlBytes);
  if (err != cudaSuccess) {
    cudaFree(p);
    return err;
  }
  *base = p;
  return cudaSuccess;
}

cudaError_t arena_free(void* base) { return base ? cudaFree(base) : cudaSuccess; }

cudaError_t export_handle(void* base, cudaIpcMemHandle_t* handle) { return cudaIpcGetMemHandle(handle, base); }

cudaError_t open_handle(const cudaIpcMemHandle_t& handle, void** base) {
  return cudaIpcOpenMemHandle(base, handle, cudaIpcMemLazyEnablePeerAccess);
}

cudaError_t close_handle(void* base) { return cudaIpcCloseMemHandle(base); }

}  // namespace cuda_ipc
}  // namespace fastpar
