// The phase step (phase_step.h) as a one-thread kernel. Why a kernel of its
// own rather than a barrier inside the reduce kernel: the protocol has one
// flag per rank, posted once every write of the rank is done; between
// kernels, stream order gives that for free, where inside one kernel it would
// need a grid-wide barrier (and co-resident blocks). The cost is one extra
// launch per phase.
#pragma once

#include "../../transport/cuda_ipc/device_memory_order.cuh"
#include "phase_step.h"

namespace fastpar {
namespace cuda_ipc {

__global__ void phase_kernel(const __grid_constant__ PhaseArgs a) { phase_step<DeviceMemory>(a); }

}  // namespace cuda_ipc
}  // namespace fastpar
