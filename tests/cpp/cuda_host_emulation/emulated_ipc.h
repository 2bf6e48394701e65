// The CUDA IPC pieces the host emulation shares between its programs: the
// host memory-ordering policy, launch_phase running the very phase_step the
// kernel runs (phase_step.h) over host atomics, arenas in plain host memory
// (every thread can read every arena, as IPC mappings let processes), and a
// communicator view per rank.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "emulated_launchers.h"
#include "csrc/transport/cuda_ipc/allreduce_ipc.h"
#include "csrc/transport/cuda_ipc/fused_one_shot.h"
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

// The fused one-shot kernel (fused_one_shot.cu) with its blocks run one after
// the other and 5 "threads" per block: the same copy-in, per-block barrier
// and reduction code. Every rank walks its blocks in the same order, so
// block b's barrier always finds its peers' block b. A failed barrier ends
// the emulated grid (on the GPU the other blocks go on to fail on their own
// waits: peers see this rank's abort word).
inline std::atomic<int> g_fused_launches{0};

cudaError_t launch_fused_one_shot(DType dt, ReduceOp op, const FusedArgs& a, cudaStream_t) {
  if (a.nblocks < 1 || a.nblocks > kFusedMaxBlocks) return cudaErrorInvalidValue;
  ++g_fused_launches;
  const int nt = 5;
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    FASTPAR_DISPATCH_OP(op, [&] {
      if constexpr (op_supports<scalar_t, kOp>()) {
        if (*a.phase.status != 0) {
          flags::abort_rank<HostMemory>(a.phase.self, *a.phase.status);
          return;
        }
        for (int b = 0; b < a.nblocks; ++b) {
          for (int t = 0; t < nt; ++t) fused_copy_in<scalar_t>(a, b, t, nt);
          if (fused_block_barrier<HostMemory>(a, b) != flags::WaitStatus::kOk) return;
          for (int t = 0; t < nt; ++t) fused_reduce<scalar_t, kOp>(a, b, t, nt);
        }
      }
    });
  });
  return cudaSuccess;
}

// The graphed kernel (fused_one_shot.cu's fused_graph_kernel), emulated the
// same way: per block, epoch, copy-in, start barrier, reduction, end barrier.
inline std::atomic<int> g_graph_launches{0};

cudaError_t launch_fused_graph(DType dt, ReduceOp op, const GraphArgs& a, cudaStream_t) {
  if (a.f.nblocks < 1 || a.f.nblocks > kFusedMaxBlocks) return cudaErrorInvalidValue;
  ++g_graph_launches;
  const int nt = 5;
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    FASTPAR_DISPATCH_OP(op, [&] {
      if constexpr (op_supports<scalar_t, kOp>()) {
        if (*a.f.phase.status != 0) {
          flags::abort_rank<HostMemory>(a.f.phase.self, *a.f.phase.status);
          return;
        }
        for (int b = 0; b < a.f.nblocks; ++b) {
          const uint64_t e = graph_epoch(a, b);
          for (int t = 0; t < nt; ++t) fused_copy_in<scalar_t>(a.f, b, t, nt);
          if (graph_block_barrier<HostMemory>(a, b, e, true) != flags::WaitStatus::kOk) return;
          for (int t = 0; t < nt; ++t) fused_reduce<scalar_t, kOp>(a.f, b, t, nt);
          if (graph_block_barrier<HostMemory>(a, b, e, false) != flags::WaitStatus::kOk) return;
          graph_done(a, b, e);
        }
      }
    });
  });
  return cudaSuccess;
}

}  // namespace cuda_ipc
}  // namespace fastpar

namespace emulated {

struct Arenas {
  std::vector<std::vector<uint4>> store;
  std::vector<void*> bases;
  size_t registered_bytes;
  Arenas(int n, size_t slot_bytes, size_t registered = 0) : registered_bytes(registered) {
    for (int r = 0; r < n; ++r) {
      store.emplace_back(fastpar::cuda_ipc::arena_bytes(slot_bytes, registered) / 16 + 1, uint4{});  // zeroed header
      bases.push_back(store.back().data());
    }
  }
};

// Whether comm_for's communicators run the fused one-shot (the default, as
// the front ends) or the three-launch schedule.
inline bool g_fused_one_shot = true;

inline fastpar::cuda_ipc::IpcComm comm_for(const Arenas& a, int rank, size_t slot_bytes) {
  fastpar::cuda_ipc::IpcComm c;
  c.fused_one_shot = g_fused_one_shot;
  c.fused_bytes_per_block = 64;  // small calls still get several blocks (up to kFusedMaxBlocks)
  c.rank = rank;
  c.size = int(a.bases.size());
  c.device = rank;
  for (int q = 0; q < c.size; ++q) c.bases[q] = a.bases[size_t(q)];
  c.slot_bytes = slot_bytes;
  c.registered_bytes = a.registered_bytes;
  c.timeout_ns = 20ull * 1000 * 1000 * 1000;
  return c;
}

}  // namespace emulated
