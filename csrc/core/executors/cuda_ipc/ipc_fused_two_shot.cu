// The fused two-shot allreduce kernels (ipc_fused_two_shot.h): a whole call,
// every chunk and phase, in one launch; the eager one and the one CUDA graphs
// can capture.
#include "../../kernels/reduce_ops.h"
#include "../../transport/cuda_ipc/device_memory_order.cuh"
#include "gpu_block.cuh"
#include "ipc_fused_two_shot.h"

namespace fastpar {
namespace cuda_ipc {
namespace {

// One block of 512 threads per SM, 128 registers a thread, without spills
// (tests/tooling/test_cuda_resources.py), and the kTwoShotMaxBlocks blocks of
// all ranks sharing one GPU (two_shot_blocks) resident together on an H100's
// 132 SMs. tests/tooling/test_cuda_sass.py checks the register count against
// these numbers.
constexpr int kTwoShotThreads = 512;
static_assert(kTwoShotThreads >= kMaxIpcRanks, "the barrier waits for each peer on a thread of its own");
constexpr int kTwoShotMinBlocksPerSm = 1;
static_assert(kTwoShotMinBlocksPerSm == kFusedGridBlocksPerSm, "the grid cap (ipc_comm.h) counts this many");

template <typename T, ReduceOp OP>
__global__ void __launch_bounds__(kTwoShotThreads, kTwoShotMinBlocksPerSm) fused_two_shot_kernel(const __grid_constant__ TwoShotArgs a) {
  __shared__ int shared;
  GpuBlock blk{&shared};
  two_shot_block<DeviceMemory, T, OP>(a, int(blockIdx.x), blk);
}

// The two-shot a CUDA graph can capture (ipc_graph.h): the same shape.
template <typename T, ReduceOp OP>
__global__ void __launch_bounds__(kTwoShotThreads, kTwoShotMinBlocksPerSm) graph_two_shot_kernel(const __grid_constant__ GraphTwoShotArgs a) {
  __shared__ int shared;
  GpuBlock blk{&shared};
  graph_two_shot_block<DeviceMemory, T, OP>(a, int(blockIdx.x), blk);
}

template <typename T, ReduceOp OP>
struct LoadTwoShot {
  static cudaError_t run() {
    cudaFuncAttributes attr;
    const cudaError_t e = cudaFuncGetAttributes(&attr, fused_two_shot_kernel<T, OP>);
    return e != cudaSuccess ? e : cudaFuncGetAttributes(&attr, graph_two_shot_kernel<T, OP>);
  }
};

template <typename T, ReduceOp OP>
cudaError_t launch_instance(const TwoShotArgs& a, cudaStream_t stream) {
  fused_two_shot_kernel<T, OP><<<unsigned(a.nblocks), kTwoShotThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

template <typename T, ReduceOp OP>
cudaError_t launch_graph_instance(const GraphTwoShotArgs& a, cudaStream_t stream) {
  graph_two_shot_kernel<T, OP><<<unsigned(a.t.nblocks), kTwoShotThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

bool valid_launch(const TwoShotArgs& a) {
  return a.nblocks >= 1 && a.nblocks <= kTwoShotMaxBlocks && a.phase.size <= kMaxIpcRanks && a.chunks >= 1;
}

}  // namespace

#if defined(FASTPAR_SASS_PROBE)
// tests/tooling/test_cuda_sass.py compiles this file alone for its registers
// and SASS: float32 and bfloat16 SUM only, seconds of nvcc instead of minutes.
cudaError_t preload_fused_two_shot_kernels() {
  const cudaError_t e = LoadTwoShot<float, ReduceOp::SUM>::run();
  return e != cudaSuccess ? e : LoadTwoShot<bf16, ReduceOp::SUM>::run();
}

cudaError_t launch_fused_two_shot(DType dt, ReduceOp op, const TwoShotArgs& a, cudaStream_t stream) {
  if (op != ReduceOp::SUM) return cudaErrorInvalidValue;
  if (dt == DType::F32) return launch_instance<float, ReduceOp::SUM>(a, stream);
  if (dt == DType::BF16) return launch_instance<bf16, ReduceOp::SUM>(a, stream);
  return cudaErrorInvalidValue;
}

cudaError_t launch_graph_two_shot(DType dt, ReduceOp op, const GraphTwoShotArgs& a, cudaStream_t stream) {
  if (op != ReduceOp::SUM) return cudaErrorInvalidValue;
  if (dt == DType::F32) return launch_graph_instance<float, ReduceOp::SUM>(a, stream);
  if (dt == DType::BF16) return launch_graph_instance<bf16, ReduceOp::SUM>(a, stream);
  return cudaErrorInvalidValue;
}
#else
cudaError_t preload_fused_two_shot_kernels() { return for_each_kernel<LoadTwoShot>(cudaSuccess); }

cudaError_t launch_fused_two_shot(DType dt, ReduceOp op, const TwoShotArgs& a, cudaStream_t stream) {
  if (!valid_launch(a)) return cudaErrorInvalidValue;
  cudaError_t result = cudaErrorInvalidValue;  // stays so for an op without a kernel
  FASTPAR_DISPATCH_DTYPE(dt, [&] { FASTPAR_DISPATCH_OP(op, [&] { result = launch_instance<scalar_t, kOp>(a, stream); }); });
  return result;
}

cudaError_t launch_graph_two_shot(DType dt, ReduceOp op, const GraphTwoShotArgs& a, cudaStream_t stream) {
  if (!valid_launch(a.t) || a.t.chunks != 1) return cudaErrorInvalidValue;
  cudaError_t result = cudaErrorInvalidValue;  // stays so for an op without a kernel
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    FASTPAR_DISPATCH_OP(op, [&] { result = launch_graph_instance<scalar_t, kOp>(a, stream); });
  });
  return result;
}
#endif

}  // namespace cuda_ipc
}  // namespace fastpar
