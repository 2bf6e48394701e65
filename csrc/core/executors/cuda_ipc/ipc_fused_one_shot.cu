// The fused one-shot allreduce kernels (ipc_fused_one_shot.h): copy-in, per-block
// barrier and reduction in one launch; the eager one and the one CUDA graphs
// can capture.
#include "../../kernels/reduce_ops.h"
#include "../../transport/cuda_ipc/device_memory_order.cuh"
#include "gpu_block.cuh"
#include "ipc_fused_one_shot.h"

namespace fastpar {
namespace cuda_ipc {
namespace {

constexpr int kFusedThreads = 512;
// One block per SM, as the fused two-shot: up to 128 registers a thread, so
// the packs in flight of the reduction (fused_reduce: 2 of each of up to 4
// ranks, then 4 ranks at a time) and the graphed kernel's state stay in
// registers (tests/tooling/test_cuda_resources.py: no stack frame). Block b
// of every rank sharing a GPU stays resident at once because the grid is
// capped as the two-shot's (fused_one_shot_blocks: fused_grid_cap, at most
// (SMs - 2) / ranks per GPU). Without the bound ptxas picks its own target
// and spills in the loop. tests/tooling/test_cuda_sass.py checks the
// registers and the loads in flight.
constexpr int kFusedMinBlocksPerSm = 1;
static_assert(kFusedMinBlocksPerSm == kFusedGridBlocksPerSm, "the grid cap (ipc_comm.h) counts this many");

static_assert(kFusedThreads >= kMaxIpcRanks, "the barrier waits for each peer on a thread of its own");

template <typename T, ReduceOp OP>
__global__ void __launch_bounds__(kFusedThreads, kFusedMinBlocksPerSm) fused_one_shot_kernel(const __grid_constant__ FusedArgs a) {
  __shared__ int shared;
  GpuBlock blk{&shared};
  one_shot_block<DeviceMemory, T, OP>(a, int(blockIdx.x), blk);
}

// As above, for CUDA graphs: a failure, earlier or in this replay, also sets
// the failure word (graph_failed, ipc_fused_one_shot.h).
template <typename T, ReduceOp OP>
__global__ void __launch_bounds__(kFusedThreads, kFusedMinBlocksPerSm) fused_graph_kernel(const __grid_constant__ GraphArgs a) {
  __shared__ int shared;
  GpuBlock blk{&shared};
  graph_block<DeviceMemory, T, OP>(a, int(blockIdx.x), blk);
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

// Checks the launch, then dtype x op dispatch of one of the launches above.
template <template <typename, ReduceOp> class Launch, class Args>
cudaError_t dispatch_fused(DType dt, ReduceOp op, const Args& a, int nblocks, int size, cudaStream_t stream) {
  if (nblocks < 1 || nblocks > kFusedMaxBlocks || size > kMaxIpcRanks) return cudaErrorInvalidValue;
#if defined(FASTPAR_SASS_PROBE)
  // tests/tooling/test_cuda_sass.py compiles this file alone for its
  // registers and SASS: float32 and bfloat16 SUM only, seconds of nvcc.
  if (op != ReduceOp::SUM || (dt != DType::F32 && dt != DType::BF16)) return cudaErrorInvalidValue;
  if (dt == DType::F32) Launch<float, ReduceOp::SUM>::run(a, nblocks, stream);
  else Launch<bf16, ReduceOp::SUM>::run(a, nblocks, stream);
  return cudaGetLastError();
#else
  cudaError_t result = cudaErrorInvalidValue;  // stays so for an op without a kernel (cuda_reduce.cu)
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    FASTPAR_DISPATCH_OP(op, [&] {
      Launch<scalar_t, kOp>::run(a, nblocks, stream);
      result = cudaGetLastError();
    });
  });
  return result;
#endif
}

}  // namespace

#if defined(FASTPAR_SASS_PROBE)
cudaError_t preload_fused_kernels() {
  const cudaError_t e = LoadFusedKernels<float, ReduceOp::SUM>::run();
  return e != cudaSuccess ? e : LoadFusedKernels<bf16, ReduceOp::SUM>::run();
}
#else
cudaError_t preload_fused_kernels() { return for_each_kernel<LoadFusedKernels>(cudaSuccess); }
#endif

cudaError_t launch_fused_graph(DType dt, ReduceOp op, const GraphArgs& a, cudaStream_t stream) {
  return dispatch_fused<LaunchGraph>(dt, op, a, a.f.nblocks, a.f.phase.size, stream);
}

cudaError_t launch_fused_one_shot(DType dt, ReduceOp op, const FusedArgs& a, cudaStream_t stream) {
  return dispatch_fused<LaunchOneShot>(dt, op, a, a.nblocks, a.phase.size, stream);
}

}  // namespace cuda_ipc
}  // namespace fastpar
