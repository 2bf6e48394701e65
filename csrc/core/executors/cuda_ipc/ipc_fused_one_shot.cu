// The fused one-shot allreduce kernels (ipc_fused_one_shot.h): copy-in, per-block
// barrier and reduction in one launch; the eager one and the one CUDA graphs
// can capture.
#include "../../kernels/reduce_ops.h"
#include "../../transport/cuda_ipc/device_memory_order.cuh"
#include "ipc_fused_one_shot.h"

namespace fastpar {
namespace cuda_ipc {
namespace {

constexpr int kFusedThreads = 512;
// Two blocks per SM: caps registers at 64, which holds the 8 packs of the
// rank loop (fused_reduce), and keeps block b of 8 ranks sharing one GPU
// resident at once (8 x kFusedMaxBlocks blocks). Without the second bound
// ptxas picks its own target and spills in the loop.
constexpr int kFusedMinBlocksPerSm = 2;

template <typename T, ReduceOp OP>
__global__ void __launch_bounds__(kFusedThreads, kFusedMinBlocksPerSm) fused_one_shot_kernel(FusedArgs a) {
  __shared__ int failed;
  const int b = int(blockIdx.x), t = int(threadIdx.x), nt = int(blockDim.x);
  if (t == 0) failed = fused_prior_failure<DeviceMemory>(a.phase, b) != 0;
  __syncthreads();
  if (failed) return;  // an earlier call failed here: write nothing (the host raises it)
  fused_copy_in<T>(a, b, t, nt);
  // Every thread's slot writes happen before thread 0's system-scope release.
  __syncthreads();
  if (t == 0) failed = fused_block_barrier<DeviceMemory>(a, b) != flags::WaitStatus::kOk;
  // Thread 0's acquire of the peers' flags orders the block's reads below.
  __syncthreads();
  if (failed) return;
  fused_reduce<T, OP>(a, b, t, nt);
}

// As above, but a failure, earlier or in this replay, traps (graph_trap,
// ipc_fused_one_shot.h): no host check follows a replay.
template <typename T, ReduceOp OP>
__global__ void __launch_bounds__(kFusedThreads, kFusedMinBlocksPerSm) fused_graph_kernel(GraphArgs a) {
  __shared__ int failed;
  __shared__ uint64_t epoch;
  const int b = int(blockIdx.x), t = int(threadIdx.x), nt = int(blockDim.x);
  if (t == 0) {
    failed = graph_prior_failure<DeviceMemory>(a, b) != 0;
    epoch = graph_epoch(a, b);
  }
  __syncthreads();
  if (failed) return;
  const int64_t off = graph_slot_offset(a, epoch);
  fused_copy_in<T>(a.f, b, t, nt, off);
  __syncthreads();
  if (t == 0) failed = graph_block_barrier<DeviceMemory>(a, b, epoch) != flags::WaitStatus::kOk;
  __syncthreads();
  if (failed) return;
  fused_reduce<T, OP>(a.f, b, t, nt, off);
  // No second barrier: the next replay copies in to the other graph slot
  // (ipc_fused_one_shot.h).
  if (t == 0) graph_done(a, b, epoch);
}

// dtype x op dispatch of one of the kernels above.
template <template <typename, ReduceOp> class Launch, class Args>
cudaError_t dispatch_fused(DType dt, ReduceOp op, const Args& a, int nblocks, int size, cudaStream_t stream) {
  if (nblocks < 1 || nblocks > kFusedMaxBlocks || size > kMaxIpcRanks) return cudaErrorInvalidValue;
  cudaError_t result = cudaErrorInvalidValue;  // stays so for an op without a kernel (cuda_reduce.cu)
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    FASTPAR_DISPATCH_OP(op, [&] {
      Launch<scalar_t, kOp>::run(a, nblocks, stream);
      result = cudaGetLastError();
    });
  });
  return result;
}

template <typename T, ReduceOp OP>
struct LaunchOneShot {
  static void run(const FusedArgs& a, int nblocks, cudaStream_t s) {
    fused_one_shot_kernel<T, OP><<<unsigned(nblocks), kFusedThreads, 0, s>>>(a);
  }
};

template <typename T, ReduceOp OP>
struct LaunchGraph {
  static void run(const GraphArgs& a, int nblocks, cudaStream_t s) {
    fused_graph_kernel<T, OP><<<unsigned(nblocks), kFusedThreads, 0, s>>>(a);
  }
};

template <typename T, ReduceOp OP>
struct LoadFusedKernels {
  static cudaError_t run() {
    cudaFuncAttributes attr;
    const cudaError_t e = cudaFuncGetAttributes(&attr, fused_one_shot_kernel<T, OP>);
    return e != cudaSuccess ? e : cudaFuncGetAttributes(&attr, fused_graph_kernel<T, OP>);
  }
};

}  // namespace

cudaError_t preload_fused_kernels() { return for_each_kernel<LoadFusedKernels>(cudaSuccess); }

cudaError_t launch_fused_graph(DType dt, ReduceOp op, const GraphArgs& a, cudaStream_t stream) {
  return dispatch_fused<LaunchGraph>(dt, op, a, a.f.nblocks, a.f.phase.size, stream);
}

cudaError_t launch_fused_one_shot(DType dt, ReduceOp op, const FusedArgs& a, cudaStream_t stream) {
  return dispatch_fused<LaunchOneShot>(dt, op, a, a.nblocks, a.phase.size, stream);
}

}  // namespace cuda_ipc
}  // namespace fastpar
