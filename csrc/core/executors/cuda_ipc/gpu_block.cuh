// The block policy of the one-kernel calls on the GPU (one_shot_block,
// graph_block, two_shot_block, fused_coll_block: leader(f), threads(f),
// barrier(phase)); the host emulation has its own (emulated_ipc.h's
// HostBlock), so the kernels' block bodies run on both.
#pragma once

#include "phase_step.h"  // barrier_peer

namespace fastpar {
namespace cuda_ipc {

struct GpuBlock {
  int* shared;  // one __shared__ int of the kernel's
  template <class F>
  __device__ bool leader(F f) {
    // The block's writes (and its reads of the last shared value) happen
    // before thread 0's flag release; thread 0's acquire before the reads.
    __syncthreads();
    if (threadIdx.x == 0) *shared = f() ? 1 : 0;
    __syncthreads();
    return *shared != 0;
  }
  template <class F>
  __device__ void threads(F f) {
    f(int(threadIdx.x), int(blockDim.x));
  }
  // The barrier of a phase object (phase_step.h, BlockPhase): thread 0
  // releases the block's flag while threads 1 .. n-1 wait at the same time,
  // thread t for peer barrier_peer(rank, n, t), after its notify (the
  // arrival in that peer's memory, in the form that has one). A warp's
  // threads spinning on different words make progress independently from
  // Volta on. The first __syncthreads() orders every thread's writes before
  // thread 0's release; the last, which also ORs the failures, orders every
  // wait's acquire before any thread's reads. Threads are at least
  // kMaxIpcRanks (the kernels' static_asserts).
  template <class Phase>
  __device__ bool barrier(const Phase& ph) {
    __syncthreads();
    const int t = int(threadIdx.x), n = ph.p.size;
    bool failed = false;
    if (t == 0) {
      failed = ph.arrive();
    } else if (t < n) {
      const int q = barrier_peer(ph.p.rank, n, t);
      ph.notify(q);
      failed = ph.wait(q, ph.deadline());
    }
    return __syncthreads_or(failed ? 1 : 0) != 0;
  }
};

}  // namespace cuda_ipc
}  // namespace fastpar
