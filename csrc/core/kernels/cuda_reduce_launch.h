// Host-side entry points of the reduce kernels (cuda_reduce.cu), type-erased
// over DType / ReduceOp so that transports and torch glue compiled by the host
// compiler can call them without seeing any __global__ code.
//
// Every launcher runs on `stream`, which must belong to the current device,
// and returns the launch's cudaError_t (cudaSuccess when there is nothing to do).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "reduce_ops.h"

namespace fastpar {
namespace cuda_kernels {

constexpr int kMaxReducePtrs = 8;  // == kMaxPtrs in cuda_reduce.cuh

// dsts[d][i] = finalize(srcs[0][i] (+) ... (+) srcs[nsrc-1][i]), i in [0, count).
// A destination may alias a source element for element. Pointers may be peer
// device pointers when the current device has peer access to their device.
struct ReduceLaunch {
  const void* srcs[kMaxReducePtrs];
  void* dsts[kMaxReducePtrs];
  int nsrc = 0;
  int ndst = 0;
  int64_t count = 0;
  int contributions = 1;  // the AVG divisor
  // Skip the whole kernel when *guard != 0 (device memory; nullptr: never).
  const uint32_t* guard = nullptr;
  // Ranks whose kernels share this GPU (processes under MPS): the grid is
  // capped at 1/gpu_sharers of the GPU (launch_shape.h). 1: the whole GPU.
  int gpu_sharers = 1;
};

cudaError_t launch_reduce(DType dt, ReduceOp op, const ReduceLaunch& args, cudaStream_t stream);

// Loads every launch_reduce kernel now (CUDA loads kernels lazily by default,
// at their first launch, and a load may wait for the running kernels: a
// flag-waiting kernel of ours that needs a peer's later kernels could then
// wait on a load that waits on it). Called at the CUDA IPC setup, as NCCL
// loads its kernels at communicator init.
cudaError_t preload_reduce_kernels();

// Ring fold: out_acc[i] = (prev_acc ? prev_acc[i] : prev_data[i]) (+) mine[i],
// out_acc in the accumulator type (float for float16/bfloat16).
cudaError_t launch_ring_fold(DType dt, ReduceOp op, const void* prev_acc, const void* prev_data,
                             const void* mine, void* out_acc, int64_t count, cudaStream_t stream);

// Ring finish: out[i] = finalize((prev_acc ? prev_acc[i] : prev_data[i]) (+) mine[i]), as T.
// `out` may be `mine`.
cudaError_t launch_ring_finish(DType dt, ReduceOp op, const void* prev_acc, const void* prev_data,
                               const void* mine, void* out, int64_t count, int contributions,
                               cudaStream_t stream);

// A data kernel's launch shape from the GPU at hand, asked of the driver once
// and cached: the SM count of `device`, and the blocks of `kernel` (a
// __global__ function) resident per SM at `threads` threads, from its
// registers and shared memory (cudaOccupancyMaxActiveBlocksPerMultiprocessor).
cudaError_t sm_count(int device, int* sms);
cudaError_t resident_blocks(const void* kernel, int threads, int* blocks);

}  // namespace cuda_kernels
}  // namespace fastpar
