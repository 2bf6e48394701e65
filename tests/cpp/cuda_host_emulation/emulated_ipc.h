// The CUDA IPC pieces the host emulation shares between its programs: the
// host memory-ordering policy, launch_phase running the very phase_step the
// kernel runs (phase_step.h) over host atomics, arenas in plain host memory
// (every thread can read every arena, as IPC mappings let processes), and a
// communicator view per rank.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "emulated_launchers.h"
#include "csrc/core/executors/cuda_ipc/ipc_allreduce.h"
#include "csrc/core/executors/cuda_ipc/ipc_fused_collectives.h"
#include "csrc/core/executors/cuda_ipc/ipc_fused_one_shot.h"
#include "csrc/core/executors/cuda_ipc/ipc_fused_two_shot.h"
#include "csrc/core/executors/cuda_ipc/phase_launch.h"
#include "csrc/core/executors/cuda_ipc/phase_step.h"

namespace fastpar {
namespace cuda_ipc {

// The host memory-ordering policy, as the CPU shared-memory transport's.
struct HostMemory {
  static uint64_t load_acquire(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
  static uint64_t load_acquire_host(const uint64_t* p) { return load_acquire(p); }
  static void store_release_host(uint64_t* p, uint64_t v) { store_release(p, v); }
  static void store_release(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
  // The kWaiterMemory form's polls of a word in this rank's memory.
  static uint64_t load_relaxed(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
  static void pause() { std::this_thread::yield(); }
  static uint64_t now_ns() {
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count());
  }
  static uint32_t load_u32(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
  static uint32_t cas_u32(uint32_t* p, uint32_t expected, uint32_t desired) {
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    return expected;  // what the word held: `expected` on success
  }
  static void store_release_u32(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
  static uint64_t fetch_add(uint64_t* p, uint64_t v) { return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL); }
};

cudaError_t launch_phase(const PhaseArgs& a, cudaStream_t) {
  if (fake_cuda::launch_refused()) return cudaGetLastError();
  phase_step<HostMemory>(a);
  return cudaGetLastError();  // as ipc_phase_kernel.cu: a stale error too
}

// The fused kernels' grid: block b on a thread of its own, 5 "threads" per
// block, all blocks at once, as the GPU may run them. Started in reverse
// order, and every third block late, so block 0 is often the last to start:
// a sequential walk in block order would always let block 0 compare
// descriptors first and hide what the other blocks do meanwhile (a
// desynced call's other blocks giving up on a peer's abort word).
inline std::atomic<int> g_fused_launches{0};
constexpr int kEmulatedThreads = 5;

template <class Block>
void run_blocks(int nblocks, Block block) {
  std::vector<std::thread> blocks;
  for (int b = nblocks - 1; b >= 0; --b)
    blocks.emplace_back([&block, b] {
      if ((b * 7919 + 13) % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50 * b));
      block(b);
    });
  for (auto& t : blocks) t.join();
}

// The block policy of the emulated kernels (gpu_block.cuh's GpuBlock on the
// GPU): the block's kEmulatedThreads "threads" one after the other between
// its synchronization points. A barrier's per-peer waits, which the GPU runs
// at once, one thread per peer, run here after the arrival, one after the
// other, in thread order in even blocks and in reverse in odd ones: two of
// the orders the GPU may run them in. The
// waits need no order among themselves: each reads only its peer's words, a
// failed one records through the status word's compare-and-swap (the first
// stands), and the others then stop on the status word (OwnStatusPoll), as
// on the GPU.
struct HostBlock {
  template <class F>
  bool leader(F f) {
    return f();
  }
  template <class F>
  void threads(F f) {
    for (int t = 0; t < kEmulatedThreads; ++t) f(t, kEmulatedThreads);
  }
  template <class Phase>
  bool barrier(const Phase& ph) {
    bool failed = ph.arrive();  // thread 0
    const int n = ph.p.size;
    // Every notification before the first wait: on the GPU each thread
    // notifies its peer, then waits, all at once; here, one after the other,
    // a wait could stand for a peer that waits for this rank before it
    // notifies it.
    for (int i = 1; i < n; ++i) ph.notify(barrier_peer(ph.p.rank, n, ph.b % 2 == 0 ? i : n - i));
    // The GPU's waiting threads start together: one deadline for all.
    const uint64_t deadline = ph.deadline();
    for (int i = 1; i < n; ++i) {
      const int t = ph.b % 2 == 0 ? i : n - i;
      if (ph.wait(barrier_peer(ph.p.rank, n, t), deadline)) failed = true;
    }
    return failed;
  }
};

// The schedule and grid of the last one-kernel all_reduce this thread (the
// rank's, in these programs) launched, eager or graphed: a replay must run
// the eager call's of its size.
enum class AllreduceKernel { kNone, kOneShot, kTwoShot };
struct AllreduceShape {
  AllreduceKernel kernel = AllreduceKernel::kNone;
  int nblocks = 0;
  bool graphed = false;
};
inline thread_local AllreduceShape g_last_allreduce;

// The fused one-shot kernel (ipc_fused_one_shot.cu): one_shot_block itself,
// every block on a thread of its own.
cudaError_t launch_fused_one_shot(DType dt, ReduceOp op, const FusedArgs& a, cudaStream_t) {
  if (a.nblocks < 1 || a.nblocks > kFusedMaxBlocks) return cudaErrorInvalidValue;
  if (fake_cuda::launch_refused()) return cudaGetLastError();
  ++g_fused_launches;
  g_last_allreduce = {AllreduceKernel::kOneShot, a.nblocks, false};
  // Copy-in (read + write), then n slots read and the output written.
  fake_cuda::stream_ops.bytes += a.count * dtype_size(dt) * (2 + a.contributions + 1);
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    FASTPAR_DISPATCH_OP(op, [&] {
      run_blocks(a.nblocks, [&](int b) {
        HostBlock blk;
        one_shot_block<HostMemory, scalar_t, kOp>(a, b, blk);
      });
    });
  });
  return cudaGetLastError();  // as ipc_fused_one_shot.cu: a stale error too
}

// The graphed kernel (ipc_fused_one_shot.cu's fused_graph_kernel): graph_block
// itself, emulated the same way.
inline std::atomic<int> g_graph_launches{0};

cudaError_t launch_fused_graph(DType dt, ReduceOp op, const GraphArgs& a, cudaStream_t) {
  if (a.f.nblocks < 1 || a.f.nblocks > kFusedMaxBlocks) return cudaErrorInvalidValue;
  if (fake_cuda::launch_refused()) return cudaGetLastError();
  ++g_graph_launches;
  g_last_allreduce = {AllreduceKernel::kOneShot, a.f.nblocks, true};
  fake_cuda::stream_ops.bytes += a.f.count * dtype_size(dt) * (2 + a.f.contributions + 1);
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    FASTPAR_DISPATCH_OP(op, [&] {
      run_blocks(a.f.nblocks, [&](int b) {
        HostBlock blk;
        graph_block<HostMemory, scalar_t, kOp>(a, b, blk);
      });
    });
  });
  return cudaGetLastError();  // as ipc_fused_one_shot.cu: a stale error too
}

// The fused two-shot kernel (ipc_fused_two_shot.cu): two_shot_block itself,
// every block on a thread of its own (run_blocks), its kEmulatedThreads
// "threads" one after the other between the block's flag steps.
inline std::atomic<int> g_two_shot_launches{0};


// What the kernel reads plus writes: per chunk, the publish and the copy-out
// of every other shard (each read once, written once) and the reduction of
// this rank's (n sources read, 2 destinations written): (5n - 2) / n of the
// data per rank when the shards are equal.
template <typename T>
int64_t two_shot_bytes(const TwoShotArgs& a) {
  const int n = a.phase.size;
  int64_t bytes = 0;
  for (int64_t k = 0; k < a.chunks; ++k) {
    for (int q = 0; q < n; ++q) {
      int64_t sb, se;
      two_shot_shard<T>(a, k, q, &sb, &se);
      bytes += (se - sb) * int64_t(sizeof(T)) * (q == a.phase.rank ? n + 2 : 4);
    }
  }
  return bytes;
}

cudaError_t launch_fused_two_shot(DType dt, ReduceOp op, const TwoShotArgs& a, cudaStream_t) {
  if (a.nblocks < 1 || a.nblocks > kTwoShotMaxBlocks || a.phase.size > kMaxIpcRanks || a.chunks < 1)
    return cudaErrorInvalidValue;
  if (fake_cuda::launch_refused()) return cudaGetLastError();
  ++g_two_shot_launches;
  g_last_allreduce = {AllreduceKernel::kTwoShot, a.nblocks, false};
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    fake_cuda::stream_ops.bytes += two_shot_bytes<scalar_t>(a);
    FASTPAR_DISPATCH_OP(op, [&] {
      run_blocks(a.nblocks, [&](int b) {
        HostBlock blk;
        two_shot_block<HostMemory, scalar_t, kOp>(a, b, blk);
      });
    });
  });
  return cudaGetLastError();  // as the real launcher: a stale error too
}

// The graphed two-shot kernel (ipc_fused_two_shot.cu's graph_two_shot_kernel):
// graph_two_shot_block itself, emulated the same way; counted with the
// graphed one-shot's launches.
cudaError_t launch_graph_two_shot(DType dt, ReduceOp op, const GraphTwoShotArgs& a, cudaStream_t) {
  if (a.t.nblocks < 1 || a.t.nblocks > kTwoShotMaxBlocks || a.t.phase.size > kMaxIpcRanks || a.t.chunks != 1)
    return cudaErrorInvalidValue;
  if (fake_cuda::launch_refused()) return cudaGetLastError();
  ++g_graph_launches;
  g_last_allreduce = {AllreduceKernel::kTwoShot, a.t.nblocks, true};
  FASTPAR_DISPATCH_DTYPE(dt, [&] {
    fake_cuda::stream_ops.bytes += two_shot_bytes<scalar_t>(a.t);
    FASTPAR_DISPATCH_OP(op, [&] {
      run_blocks(a.t.nblocks, [&](int b) {
        HostBlock blk;
        graph_two_shot_block<HostMemory, scalar_t, kOp>(a, b, blk);
      });
    });
  });
  return cudaGetLastError();  // as the real launcher: a stale error too
}

// The fused collectives kernel (ipc_fused_collectives.cu): fused_coll_block
// itself, every block on a thread of its own, as the fused two-shot.
inline std::atomic<int> g_collective_launches{0};

// What the kernel reads plus writes, piece by piece, as the step-by-step
// schedules' copies and reductions count it: a copy reads and writes its
// bytes, a reduction reads n sources and writes one output.
inline int64_t fused_coll_bytes(const FusedCollArgs& a) {
  const int n = a.phase.size, r = a.phase.rank;
  if (a.kind == FusedColl::kAllreduceRegistered) {  // n reads and n writes of this rank's shard
    const int64_t sb = std::min(a.bytes, r * a.piece), se = std::min(a.bytes, sb + a.piece);
    return 2 * n * (se - sb);
  }
  int64_t bytes = 0;
  for (int64_t i = 0; i < a.pieces; ++i) {
    const int64_t len = std::max<int64_t>(0, std::min(a.piece, a.bytes - i * a.piece));
    switch (a.kind) {
      case FusedColl::kBroadcast: bytes += 2 * len; break;
      case FusedColl::kGather:
        bytes += (a.root < 0 || r != a.root ? 2 * len : 0) + (a.root < 0 || r == a.root ? 2 * n * len : 0);
        break;
      case FusedColl::kScatter: bytes += (r == a.root ? 2 * (n - 1) * len : 0) + 2 * len; break;
      case FusedColl::kAllToAll: bytes += 2 * (2 * n - 1) * len; break;
      case FusedColl::kReduce: bytes += r != a.root ? 2 * len : (n + 1) * len; break;
      case FusedColl::kReduceScatter: bytes += 2 * (n - 1) * len + (n + 1) * len; break;
      case FusedColl::kAllreduceRegistered: break;  // above
    }
  }
  return bytes;
}

cudaError_t launch_fused_collective(DType dt, ReduceOp op, const FusedCollArgs& a, cudaStream_t) {
  if (a.nblocks < 1 || a.nblocks > kTwoShotMaxBlocks || a.phase.size > kMaxIpcRanks || a.pieces < 1 ||
      a.slice < 16 || a.slice % 16 != 0)
    return cudaErrorInvalidValue;
  if (fake_cuda::launch_refused()) return cudaGetLastError();
  ++g_collective_launches;
  fake_cuda::stream_ops.bytes += fused_coll_bytes(a);
  auto run = [&](auto tag, auto op_tag) {
    using T = typename decltype(tag)::type;
    constexpr ReduceOp kOp = decltype(op_tag)::value;
    run_blocks(a.nblocks, [&](int b) {
      HostBlock blk;
      fused_coll_block<HostMemory, T, kOp>(a, b, blk);
    });
  };
  if (!fused_coll_reduces(a.kind)) {
    run(std::type_identity<uint8_t>{}, std::integral_constant<ReduceOp, ReduceOp::SUM>{});
  } else {
    FASTPAR_DISPATCH_DTYPE(dt, [&] {
      FASTPAR_DISPATCH_OP(op, [&] { run(std::type_identity<scalar_t>{}, std::integral_constant<ReduceOp, kOp>{}); });
    });
  }
  return cudaGetLastError();  // as the real launcher: a stale error too
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
// Likewise for two-shot: the fused kernel (here by default, the form these
// programs check; the front ends default to steps) or the step-by-step schedule.
inline bool g_fused_two_shot = true;
// Likewise for broadcast, gather, scatter, all_to_all, reduce and reduce_scatter.
inline bool g_fused_collectives = true;
// The one-kernel calls' block barriers (ipc_arena.h, FlagForm): the programs
// run their checks in each form.
inline fastpar::cuda_ipc::FlagForm g_flag_form = fastpar::cuda_ipc::FlagForm::kPollPeer;
constexpr fastpar::cuda_ipc::FlagForm kFlagForms[] = {fastpar::cuda_ipc::FlagForm::kPollPeer,
                                                      fastpar::cuda_ipc::FlagForm::kWaiterMemory};
inline const char* flag_form_name(fastpar::cuda_ipc::FlagForm f) {
  return f == fastpar::cuda_ipc::FlagForm::kWaiterMemory ? "waiter-memory flags" : "peer-polled flags";
}

// The aux a one-kernel call's descriptor carries in g_flag_form's form
// (phase_step.h, marked_desc).
inline int64_t fused_aux(int64_t aux) {
  fastpar::flags::OpDesc d{};
  d.aux = aux;
  return fastpar::cuda_ipc::marked_desc(d, g_flag_form).aux;
}

inline fastpar::cuda_ipc::IpcComm comm_for(const Arenas& a, int rank, size_t slot_bytes) {
  fastpar::cuda_ipc::IpcComm c;
  c.fused_one_shot = g_fused_one_shot;
  c.fused_two_shot = g_fused_two_shot;
  c.fused_collectives = g_fused_collectives;
  c.flag_form = g_flag_form;
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
