// What one multi-process collective call is, as the schedules describe it to a
// transport and as peers check it (flags::OpDesc). Torch-free.
#pragma once

#include <cstdint>
#include <string>

#include "../kernels/reduce_ops.h"
#include "flag_protocol.h"

namespace fastpar {

// Upper bound on ranks sharing one host communicator (stack arrays of source
// pointers in the schedules); more ranks per host than this is not a CPU setup
// that shared memory would serve well anyway.
constexpr int kMaxShmRanks = 64;

enum class Coll : int32_t {
  kBarrier = 1,
  kAllreduce,
  kBroadcast,
  kAllgather,
  kGather,
  kScatter,
  kReduceScatter,
  kReduce,
  kAlltoall,
  kRegister,  // registered_empty: agree on an arena offset
};

inline const char* coll_name(Coll c) {
  switch (c) {
    case Coll::kBarrier: return "barrier";
    case Coll::kAllreduce: return "allreduce";
    case Coll::kBroadcast: return "broadcast";
    case Coll::kAllgather: return "allgather";
    case Coll::kGather: return "gather";
    case Coll::kScatter: return "scatter";
    case Coll::kReduceScatter: return "reduce_scatter";
    case Coll::kReduce: return "reduce";
    case Coll::kAlltoall: return "alltoall";
    case Coll::kRegister: return "registered_empty";
  }
  return "unknown";
}

// aux values that name a schedule instead of an arena offset (offsets are far
// smaller), so ranks that would run different schedules disagree on aux.
// kAuxFused, kAuxGraphed and kAuxFusedTwoShot are CUDA IPC's single-kernel
// allreduces (ipc_fused_one_shot.h, ipc_fused_two_shot.h), whose flags differ from the phase protocol's: they must
// never meet a phase (kAuxFusedCollective, below, likewise).
constexpr int64_t kAuxOneShot = int64_t(1) << 62;
constexpr int64_t kAuxTwoShot = kAuxOneShot + 1;
constexpr int64_t kAuxFused = kAuxOneShot + 2;
constexpr int64_t kAuxGraphed = kAuxOneShot + 3;
// registered_empty's agreement from a rank whose registered arena had no room.
constexpr int64_t kAuxNoFit = kAuxOneShot + 4;
constexpr int64_t kAuxFusedTwoShot = kAuxOneShot + 5;
// The CPU allreduce's placement exchanges (cpu_shm/shm_placement.h).
constexpr int64_t kAuxPlacement = kAuxOneShot + 6;
// CUDA IPC's one-kernel broadcast, gather, scatter, all_to_all, reduce and
// reduce_scatter (ipc_fused_collectives.h): per-block flags, like the fused
// all_reduces, so a peer in the step-by-step schedule must fail the check.
constexpr int64_t kAuxFusedCollective = kAuxOneShot + 7;
// The same collectives step by step over CUDA IPC (ipc_collectives.cpp): named
// too, since a descriptor without aux (-1) matches any schedule.
constexpr int64_t kAuxStepCollective = kAuxOneShot + 8;
// The two-shot form of the graphed all_reduce (kAuxGraphed is its one-shot).
constexpr int64_t kAuxGraphedTwoShot = kAuxOneShot + 9;

// A registered all_reduce's aux is its arena offset; its one-kernel form
// (the push, ipc_fused_collectives.h) sets this bit on it, so a peer in the
// step-by-step form fails the check. Offsets stay far below it.
constexpr int64_t kAuxFusedRegistered = int64_t(1) << 61;

// Set on the aux of a CUDA IPC one-kernel call whose block barriers run in
// the kWaiterMemory form (cuda_ipc/ipc_arena.h, FlagForm; phase_step.h,
// marked_desc), so a peer in the other form fails the check. Below every
// aux it marks but the offsets, which stay far below it.
constexpr int64_t kAuxWaiterFlags = int64_t(1) << 60;

// Descriptor dtypes from here up are torch dtypes fastpar has no element
// math for (kForeignDType + the ScalarType code): the copy collectives still
// move them, and peers still compare them.
constexpr int32_t kForeignDType = 64;

// count: elements per rank as the op defines them (-1: not compared);
// aux: op-specific, e.g. a registered buffer's arena offset (-1: not compared).
struct CollCall {
  Coll op;
  int64_t count;
  DType dtype;
  int root = -1;
  int redop = -1;
  int64_t aux = -1;

  flags::OpDesc desc(uint64_t seq) const {
    return flags::OpDesc{seq, count, aux, int32_t(op), int32_t(dtype), int32_t(root), int32_t(redop)};
  }
};

// "allreduce(count=10, dtype=float32, op=SUM)" for error messages.
inline std::string describe(flags::OpDesc d) {
  const bool waiter = d.aux >= 0 && (d.aux & kAuxWaiterFlags) != 0;
  if (waiter) d.aux &= ~kAuxWaiterFlags;
  if (Coll(d.op) == Coll::kRegister) {
    // Its count is the allocation's bytes; "count=..., dtype=uint8" read as elements.
    std::string s = "registered_empty(bytes=" + std::to_string(d.count);
    if (d.aux == kAuxNoFit) return s + ", registered arena full)";
    return s + (d.aux >= 0 ? ", offset=" + std::to_string(d.aux) : "") + ")";
  }
  std::string s = coll_name(Coll(d.op));
  s += "(count=" + std::to_string(d.count) + ", dtype=";
  s += d.dtype >= kForeignDType ? "torch#" + std::to_string(d.dtype - kForeignDType) : dtype_name(DType(d.dtype));
  if (d.root >= 0) s += ", root=" + std::to_string(d.root);
  if (d.redop >= 0) s += std::string(", op=") + op_name(ReduceOp(d.redop));
  if (d.aux == kAuxOneShot) s += ", schedule=one_shot";
  else if (d.aux == kAuxTwoShot) s += ", schedule=two_shot";
  else if (d.aux == kAuxFused) s += ", schedule=fused_one_shot";
  else if (d.aux == kAuxGraphed) s += ", schedule=graphed";
  else if (d.aux == kAuxGraphedTwoShot) s += ", schedule=graphed_two_shot";
  else if (d.aux == kAuxFusedTwoShot) s += ", schedule=fused_two_shot";
  else if (d.aux == kAuxNoFit) s += ", registered arena full";
  else if (d.aux == kAuxPlacement) s += ", placement exchange";
  else if (d.aux == kAuxFusedCollective) s += ", schedule=fused";
  else if (d.aux == kAuxStepCollective) s += ", schedule=steps";
  else if (d.aux >= kAuxFusedRegistered && d.aux < kAuxOneShot)
    s += ", schedule=fused, registered offset=" + std::to_string(d.aux - kAuxFusedRegistered);
  else if (d.aux >= 0) s += ", registered offset=" + std::to_string(d.aux);
  return s + (waiter ? ", flags=waiter)" : ")");
}

}  // namespace fastpar
