// The CUDA IPC pieces the host emulation shares between its programs: the
// host memory-ordering policy, launch_phase running the very phase_step the
// kernel runs (phase_step.h) over host atomics, arenas in plain host memory
// (every thread can read every arena, as IPC mappings let processes), and a
// communicator view per rank.
#pragma once

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "emulated_launchers.h"
#include "csrc/transport/cuda_ipc/allreduce_ipc.h"
#include "csrc/transport/cuda_ipc/phase_launch.h"
#include "csrc/transport/cuda_ipc/phase_step.h"

namespace fastpar {
namespace cuda_ipc {

// The host memory-ordering policy, as the CPU shared-memory transport's.
struct HostMemory {
  static uint64_t load_acquire(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
  static void store_release(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
  static void pause() { std::this_thread::yield(); }
  static uint64_t now_ns() {
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count());
  }
};

cudaError_t launch_phase(const PhaseArgs& a, cudaStream_t) {
  phase_step<HostMemory>(a);
  return cudaSuccess;
}

}  // namespace cuda_ipc
}  // namespace fastpar

namespace emulated {

struct Arenas {
  std::vector<std::vector<uint4>> store;
  std::vector<void*> bases;
  Arenas(int n, size_t slot_bytes) {
    for (int r = 0; r < n; ++r) {
      store.emplace_back(fastpar::cuda_ipc::arena_bytes(slot_bytes) / 16 + 1, uint4{});  // zeroed header
      bases.push_back(store.back().data());
    }
  }
};

inline fastpar::cuda_ipc::IpcComm comm_for(const Arenas& a, int rank, size_t slot_bytes) {
  fastpar::cuda_ipc::IpcComm c;
  c.rank = rank;
  c.size = int(a.bases.size());
  c.device = rank;
  for (int q = 0; q < c.size; ++q) c.bases[q] = a.bases[size_t(q)];
  c.slot_bytes = slot_bytes;
  c.timeout_ns = 20ull * 1000 * 1000 * 1000;
  return c;
}

}  // namespace emulated
