#include "ipc_handles.h"

#include "../cuda_p2p/cuda_try.h"
#include "ipc_arena.h"

namespace fastpar {
namespace cuda_ipc {

cudaError_t arena_alloc(size_t slot_bytes, size_t registered_bytes, void** base) {
  *base = nullptr;
  void* p = nullptr;
  FASTPAR_CUDA_TRY(cudaMalloc(&p, arena_bytes(slot_bytes, registered_bytes)));
  // The header, the p2p counters and the graph flags must read as zero before
  // the handle is handed to any peer, whose first waits read them (memory a
  // destroyed group freed can come back holding its flags). cudaMemset is
  // asynchronous to the host and would queue behind whatever the legacy
  // stream has (a backward pass, at a lazy setup): a stream of our own,
  // synchronized before returning.
  cudaStream_t s = nullptr;
  cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (err == cudaSuccess) err = cudaMemsetAsync(p, 0, kHeaderBytes, s);
  if (err == cudaSuccess) err = cudaMemsetAsync(p2p_control_of(p, slot_bytes), 0, kP2PControlBytes, s);
  if (err == cudaSuccess) err = cudaMemsetAsync(graph_control_of(p, slot_bytes), 0, kGraphControlBytes, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  if (s) cudaStreamDestroy(s);
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
