// The p2p ring's steps (p2p_ring.h) as one-thread kernels: each step is a
// counter wait or a counter store, and a single thread keeps the peer link
// free for the copies.
#include "../../transport/cuda_ipc/device_memory_order.cuh"
#include "p2p_ring.h"

namespace fastpar {
namespace cuda_ipc {

__global__ void p2p_step_kernel(const __grid_constant__ P2PArgs a) { p2p_step<DeviceMemory>(a); }

cudaError_t preload_p2p_kernel() {
  cudaFuncAttributes attr;
  return cudaFuncGetAttributes(&attr, p2p_step_kernel);
}

cudaError_t launch_p2p_step(const P2PArgs& a, cudaStream_t stream) {
  p2p_step_kernel<<<1, 1, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace cuda_ipc
}  // namespace fastpar
