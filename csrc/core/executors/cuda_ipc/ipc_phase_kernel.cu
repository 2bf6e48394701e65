#include "ipc_phase_kernel.cuh"

namespace fastpar {
namespace cuda_ipc {

// One thread: the protocol is one flag per rank, and a single poller per GPU
// keeps the peer link free for the data.
cudaError_t preload_phase_kernel() {
  cudaFuncAttributes attr;
  return cudaFuncGetAttributes(&attr, phase_kernel);
}

cudaError_t launch_phase(const PhaseArgs& a, cudaStream_t stream) {
  phase_kernel<<<1, 1, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace cuda_ipc
}  // namespace fastpar
