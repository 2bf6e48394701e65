// The grid of the data kernels (cuda_reduce.cu: the reduce and copy kernels
// the IPC schedules enqueue between their phase kernels, and the list ops'
// ring steps), as plain host arithmetic so that ctest checks it
// (tests/cpp/test_launch_shape.cpp).
//
// One unit of work per thread up to `blocks_per_sm` blocks per SM (as many as
// the kernel's registers let be resident at once: the launchers ask the
// occupancy API); beyond that the kernels' grid-stride loops take over, so a
// block is never launched for less than a thread's share of work.
//
// Ranks sharing one GPU (several processes under MPS) enqueue such kernels at
// the same moments of a collective, and each rank's phase kernels spin on an
// SM until every peer's data kernels have run. With a whole-GPU grid each,
// `sharers` ranks ask for `sharers` GPUs' worth of resident blocks at once,
// and how their grids interleave is up to the hardware's and MPS's block
// scheduling; capped at 1/sharers of the GPU each, every rank's data kernel
// can be resident beside the others' (and beside the spinning one-thread
// phase kernels, which take one block slot each). The kernels are
// bandwidth-bound: all sharers together still fill every SM.
#pragma once

#include <cstdint>

namespace fastpar {
namespace cuda_kernels {

inline int64_t data_kernel_blocks(int64_t units, int threads_per_block, int sms, int blocks_per_sm, int sharers) {
  const int64_t wanted = (units + threads_per_block - 1) / threads_per_block;
  int64_t cap = int64_t(sms) * blocks_per_sm / (sharers > 1 ? sharers : 1);
  if (cap < 1) cap = 1;
  return wanted < 1 ? 1 : (wanted < cap ? wanted : cap);
}

}  // namespace cuda_kernels
}  // namespace fastpar
