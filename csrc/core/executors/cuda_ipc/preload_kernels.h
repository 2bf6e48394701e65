// Every kernel a CUDA IPC call can launch, loaded on the current device now
// (cudaFuncGetAttributes, as NCCL does at init): CUDA loads a kernel lazily
// at its first launch by default, and a load may wait for running kernels,
// which could be this process's own, spinning on a peer's flag
// (cuda_kernels::preload_reduce_kernels says more). Both front ends, the c10d
// backend and CudaIpcComm, call it before their rendezvous, so a rank that
// cannot load them fails before any peer maps its arena.
#pragma once

#include <cuda_runtime_api.h>

#include "../../kernels/cuda_reduce_launch.h"
#include "ipc_fused_collectives.h"
#include "ipc_fused_one_shot.h"
#include "ipc_fused_two_shot.h"
#include "p2p_ring.h"
#include "phase_launch.h"

namespace fastpar {
namespace cuda_ipc {

// cudaSuccess, or the first failure, naming its kernels in *what.
inline cudaError_t preload_ipc_kernels(const char** what) {
  const struct {
    const char* what;
    cudaError_t (*load)();
  } loads[] = {{"reduce", cuda_kernels::preload_reduce_kernels},
               {"phase", preload_phase_kernel},
               {"point-to-point", preload_p2p_kernel},
               {"fused one-shot", preload_fused_kernels},
               {"fused two-shot", preload_fused_two_shot_kernels},
               {"fused collectives", preload_fused_collective_kernels}};
  for (const auto& l : loads) {
    const cudaError_t err = l.load();
    if (err != cudaSuccess) {
      cudaGetLastError();  // not sticky: keep it from surfacing in a later launch check
      *what = l.what;
      return err;
    }
  }
  return cudaSuccess;
}

}  // namespace cuda_ipc
}  // namespace fastpar
