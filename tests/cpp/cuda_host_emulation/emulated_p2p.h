// The p2p step "kernel" of the emulation: p2p_ring.h's step run on the
// calling thread, after the fake runtime's launch-refusal hook, returning
// cudaGetLastError() as ipc_p2p_kernel.cu does (so a stale error shows too).
#pragma once

#include "emulated_ipc.h"
#include "csrc/core/executors/cuda_ipc/p2p_ring.h"

namespace fastpar {
namespace cuda_ipc {
cudaError_t launch_p2p_step(const P2PArgs& a, cudaStream_t) {
  if (fake_cuda::launch_refused()) return cudaGetLastError();
  p2p_step<HostMemory>(a);
  return cudaGetLastError();
}
}  // namespace cuda_ipc
}  // namespace fastpar
