// The one-kernel broadcast / gather / scatter / all_to_all / reduce /
// reduce_scatter (ipc_fused_collectives.h): a whole call, every piece and
// phase, in one launch.
#include "../../kernels/reduce_ops.h"
#include "../../transport/cuda_ipc/device_memory_order.cuh"
#include "gpu_block.cuh"
#include "ipc_fused_collectives.h"

namespace fastpar {
namespace cuda_ipc {
namespace {

// The fused two-shot's launch shape (ipc_fused_two_shot.cu): 512 threads,
// 128 registers a thread without spills, the blocks of every rank sharing one
// GPU resident together.
constexpr int kFusedCollThreads = 512;
static_assert(kFusedCollThreads >= kMaxIpcRanks, "the barrier waits for each peer on a thread of its own");
constexpr int kFusedCollMinBlocksPerSm = 1;
static_assert(kFusedCollMinBlocksPerSm == kFusedGridBlocksPerSm, "the grid cap (ipc_comm.h) counts this many");

template <typename T, ReduceOp OP>
__global__ void __launch_bounds__(kFusedCollThreads, kFusedCollMinBlocksPerSm)
    fused_collective_kernel(const __grid_constant__ FusedCollArgs a) {
  __shared__ int shared;
  GpuBlock blk{&shared};
  fused_coll_block<DeviceMemory, T, OP>(a, int(blockIdx.x), blk);
}

template <typename T, ReduceOp OP>
struct LoadFusedColl {
  static cudaError_t run() {
    cudaFuncAttributes attr;
    return cudaFuncGetAttributes(&attr, fused_collective_kernel<T, OP>);
  }
};

template <typename T, ReduceOp OP>
cudaError_t launch_instance(const FusedCollArgs& a, cudaStream_t stream) {
  fused_collective_kernel<T, OP><<<unsigned(a.nblocks), kFusedCollThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

bool bad_args(const FusedCollArgs& a) {
  return a.nblocks < 1 || a.nblocks > kTwoShotMaxBlocks || a.phase.size > kMaxIpcRanks || a.pieces < 1 ||
         a.slice < 16 || a.slice % 16 != 0;
}

}  // namespace

#if defined(FASTPAR_SASS_PROBE)
// tests/tooling/test_cuda_sass.py compiles this file alone for its registers
// and SASS: the copy kinds' instance (uint8 SUM) and float32 SUM only.
cudaError_t preload_fused_collective_kernels() {
  const cudaError_t e = LoadFusedColl<uint8_t, ReduceOp::SUM>::run();
  return e != cudaSuccess ? e : LoadFusedColl<float, ReduceOp::SUM>::run();
}

cudaError_t launch_fused_collective(DType dt, ReduceOp op, const FusedCollArgs& a, cudaStream_t stream) {
  if (bad_args(a)) return cudaErrorInvalidValue;
  if (!fused_coll_reduces(a.kind)) return launch_instance<uint8_t, ReduceOp::SUM>(a, stream);
  if (dt == DType::F32 && op == ReduceOp::SUM) return launch_instance<float, ReduceOp::SUM>(a, stream);
  return cudaErrorInvalidValue;
}
#else
cudaError_t preload_fused_collective_kernels() { return for_each_kernel<LoadFusedColl>(cudaSuccess); }

cudaError_t launch_fused_collective(DType dt, ReduceOp op, const FusedCollArgs& a, cudaStream_t stream) {
  if (bad_args(a)) return cudaErrorInvalidValue;
  // The copy kinds move bytes: one instance serves every dtype.
  if (!fused_coll_reduces(a.kind)) return launch_instance<uint8_t, ReduceOp::SUM>(a, stream);
  cudaError_t result = cudaErrorInvalidValue;  // stays so for an op without a kernel
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    FASTPAR_DISPATCH_OP(op, [&] { result = launch_instance<scalar_t, kOp>(a, stream); });
  });
  return result;
}
#endif

}  // namespace cuda_ipc
}  // namespace fastpar
