// The block policy of the one-kernel collectives on the GPU (two_shot_block,
// fused_coll_block: leader(f), threads(f)); the host emulation has its own
// (emulated_ipc.h's HostBlock), so the kernels' block bodies run on both.
#pragma once

namespace fastpar {
namespace cuda_ipc {

struct GpuBlock {
  int* shared;  // one __shared__ int of the kernel's
  template <class F>
  __device__ bool leader(F f) {
    // The block's writes (and its reads of the last shared value) happen
    // before thread 0's flag release; thread 0's acquire before the reads.
    __syncthreads();
    if (threadIdx.x == 0) *shared = f() ? 1 : 0;
    __syncthreads();
    return *shared != 0;
  }
  template <class F>
  __device__ void threads(F f) {
    f(int(threadIdx.x), int(blockDim.x));
  }
};

}  // namespace cuda_ipc
}  // namespace fastpar
