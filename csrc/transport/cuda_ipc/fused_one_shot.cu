// The fused one-shot allreduce kernel (fused_one_shot.h): copy-in, per-block
// barrier and reduction in one launch.
#include "../../kernels/reduce_ops.h"
#include "device_memory_order.cuh"
#include "fused_one_shot.h"

namespace fastpar {
namespace cuda_ipc {
namespace {

constexpr int kFusedThreads = 512;

template <typename T, ReduceOp OP>
__global__ void __launch_bounds__(kFusedThreads) fused_one_shot_kernel(FusedArgs a) {
  __shared__ int failed;
  const PhaseArgs& p = a.phase;
  if (*p.status != 0) {
    // An earlier call failed here: tell the peers, write nothing.
    if (blockIdx.x == 0 && threadIdx.x == 0) flags::abort_rank<DeviceMemory>(p.self, *p.status);
    return;
  }
  const int b = int(blockIdx.x), t = int(threadIdx.x), nt = int(blockDim.x);
  fused_copy_in<T>(a, b, t, nt);
  // Every thread's slot writes happen before thread 0's system-scope release.
  __syncthreads();
  if (t == 0) failed = fused_block_barrier<DeviceMemory>(a, b) != flags::WaitStatus::kOk;
  // Thread 0's acquire of the peers' flags orders the block's reads below.
  __syncthreads();
  if (failed) return;
  fused_reduce<T, OP>(a, b, t, nt);
}

}  // namespace

cudaError_t launch_fused_one_shot(DType dt, ReduceOp op, const FusedArgs& a, cudaStream_t stream) {
  if (a.nblocks < 1 || a.nblocks > kFusedMaxBlocks || a.phase.size > kMaxIpcRanks) return cudaErrorInvalidValue;
  cudaError_t result = cudaSuccess;
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    FASTPAR_DISPATCH_OP(op, [&] {
      if constexpr (!op_supports<scalar_t, kOp>()) {
        result = cudaErrorInvalidValue;
      } else {
        fused_one_shot_kernel<scalar_t, kOp><<<unsigned(a.nblocks), kFusedThreads, 0, stream>>>(a);
        result = cudaGetLastError();
      }
    });
  });
  return result;
}

}  // namespace cuda_ipc
}  // namespace fastpar
