// Which compiled variant of a one-kernel collective a call launches: each is
// built four times, for the memory scope of its flags (device_memory_order.cuh:
// DeviceMemory, or DeviceMemoryOneGpu when every rank is on this GPU,
// PhaseArgs::one_gpu_scope) and for the rank bound of its reduction
// (fused_loops.h, fused_rank_bound: the two bounds in one kernel would share one
// register allocation and spill).
#pragma once

#include "../../transport/cuda_ipc/device_memory_order.cuh"
#include "fused_loops.h"
#include "phase_launch.h"

namespace fastpar {
namespace cuda_ipc {

template <class M, int N>
struct KernelVariant {
  using Mem = M;
  static constexpr int kRankBound = N;
};

// f(KernelVariant<Mem, NMAX>{}) for the call of `p`.
template <class F>
void with_kernel_variant(const PhaseArgs& p, F&& f) {
  const bool four = fused_rank_bound(p.size) == 4;
  if (p.one_gpu_scope) {
    if (four) f(KernelVariant<DeviceMemoryOneGpu, 4>{});
    else f(KernelVariant<DeviceMemoryOneGpu, kMaxIpcRanks>{});
  } else {
    if (four) f(KernelVariant<DeviceMemory, 4>{});
    else f(KernelVariant<DeviceMemory, kMaxIpcRanks>{});
  }
}

// f(v) for every variant v, stopping at the first error (the preloads).
template <class F>
cudaError_t for_each_kernel_variant(F&& f) {
  cudaError_t e = f(KernelVariant<DeviceMemory, 4>{});
  if (e == cudaSuccess) e = f(KernelVariant<DeviceMemory, kMaxIpcRanks>{});
  if (e == cudaSuccess) e = f(KernelVariant<DeviceMemoryOneGpu, 4>{});
  if (e == cudaSuccess) e = f(KernelVariant<DeviceMemoryOneGpu, kMaxIpcRanks>{});
  return e;
}

}  // namespace cuda_ipc
}  // namespace fastpar
