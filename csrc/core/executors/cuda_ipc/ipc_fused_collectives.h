// broadcast, all_gather, gather, scatter, all_to_all, reduce and
// reduce_scatter over CUDA IPC (ipc_collectives.h) as ONE kernel per call,
// whatever the size; and in the same kernel the all_reduce of registered
// buffers as a push (fused_registered_block, below). The step-by-step
// schedules (copy_collectives_slots.h, reduce_slots.h over IpcSteps) enqueue
// per slot-sized piece a copy kernel per peer region and a one-thread phase
// kernel; this kernel walks the same pieces and phases itself, as the fused
// two-shot all_reduce does (ipc_fused_two_shot.h: the same per-block flags,
// the same phase protocol).
//
// Per piece i (slot round first_slot + i, phase desc.seq + i), block b
//   publish  copies slice b of what this rank sends (one region per
//            destination for scatter, all_to_all and reduce_scatter) into
//            its slot, and all_to_all's own block straight across;
//   phase    posts phase i on its block flag and waits for block b of every
//            peer (block_phase, phase_step.h; block 0 checks descriptors);
//   read     copies or reduces slice b of what this rank receives from the
//            peers' slots (and its own input) into its output.
// A slice is the same bytes of every piece on every rank: `slice` is cut once
// per call from min(bytes, piece), which every rank has alike, in whole
// 16-byte packs, and a shorter last piece keeps the cut. So every byte block b
// reads from a peer's slot was written by block b of that peer before the
// flag block b waited for, and blocks never wait for other blocks. Slot reuse
// is the schedule's rotation: block b writes a slot region again three pieces
// later, after waiting for a phase that block b of every peer posted after
// its last read of that region; across calls the kernel boundary orders
// everything (a later call's flags are posted by a later launch on each
// rank's stream).
//
// Failures, deadlines, the host abort word and the descriptor check are the
// two-shot kernel's (block_phase, record_failure): a launch that finds the
// status word set writes nothing; a peer in the step-by-step schedule (no
// block flags) or in another call fails at block 0's descriptor check with a
// mismatch naming schedule=fused (kAuxFusedCollective).
//
// Reductions combine the n sources in rank order in the accumulator type
// (fused_loops.h), as the reduce kernel of the step schedule: the same bits.
// Copies move bytes. Written over a memory-ordering policy (Mem) and a block
// policy (Blk), like two_shot_block, so the kernel
// (ipc_fused_collectives.cu) and the host emulation run the same code.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "../../kernels/reduce_ops.h"
#include "../../transport/cuda_ipc/ipc_arena.h"
#include "../../transport/flag_protocol.h"
#include "fused_loops.h"
#include "ipc_fused_two_shot.h"
#include "phase_step.h"

namespace fastpar {
namespace cuda_ipc {

enum class FusedColl : int32_t {
  kBroadcast,      // src[0] = dst[0] = the data; root sends
  kGather,         // src[0] = in, dst[q] = rank q's block; root < 0: every rank receives (all_gather)
  kScatter,        // src[q] = the root's block for rank q, dst[0] = out
  kAllToAll,       // src[q] = block for rank q, dst[q] = block from rank q
  kReduce,         // src[0] = in, dst[0] = out (root only)
  kReduceScatter,  // src[q] = block q of the input, dst[0] = out
  // all_reduce on registered buffers (the push): src[q] = dst[q] = rank q's
  // registered buffer at the call's offset, as mapped here
  kAllreduceRegistered,
};

// Whether a kind sends one region per destination (the slot cut in n).
FASTPAR_HD bool fused_coll_regions(FusedColl k) {
  return k == FusedColl::kScatter || k == FusedColl::kAllToAll || k == FusedColl::kReduceScatter;
}

FASTPAR_HD bool fused_coll_reduces(FusedColl k) {
  return k == FusedColl::kReduce || k == FusedColl::kReduceScatter || k == FusedColl::kAllreduceRegistered;
}

struct FusedCollArgs {
  PhaseArgs phase;  // desc.seq: piece 0's phase; piece i's is desc.seq + i
  FlagLine* self_blocks;
  const FlagLine* peer_blocks[kMaxIpcRanks];
  char* slot0[kMaxIpcRanks];  // every rank's slot 0; slot j at + j * slot_stride
  int64_t slot_stride;
  int first_slot;  // piece i's slot is (first_slot + i) % flags::kSlots
  FusedColl kind;
  int root;        // the root (-1: every rank receives; all_gather)
  int64_t bytes;   // of one block: per rank, or per destination for the region kinds
  int64_t piece;   // bytes per piece (whole elements), at most `stride` for the region kinds
  int64_t stride;  // bytes between the regions of a slot
  int64_t pieces;  // num_pieces(bytes, piece), >= 1
  int64_t slice;   // bytes of block b's slice of a piece: a multiple of 16
  const char* src[kMaxIpcRanks];
  char* dst[kMaxIpcRanks];
  int contributions;  // the AVG divisor
  int nblocks;
};

// Blocks of a call: one per `per_block` bytes of its first piece, at most
// `cap` (fused_grid_cap, ipc_comm.h), at least 1. A function of what every
// rank has alike.
FASTPAR_HD int fused_coll_blocks(int64_t bytes, int64_t piece, int64_t per_block, int cap) {
  if (per_block < 1) per_block = 1;
  const int64_t first = bytes < piece ? bytes : piece;
  int64_t b = (first + per_block - 1) / per_block;
  if (b > cap) b = cap;
  return int(b < 1 ? 1 : b);
}

// Bytes of a block's slice: the first piece cut in nblocks runs of whole
// 16-byte packs (so each slice keeps the buffers' vector alignment and holds
// whole elements).
FASTPAR_HD int64_t fused_coll_slice(int64_t bytes, int64_t piece, int nblocks) {
  const int64_t first = bytes < piece ? bytes : piece;
  const int64_t packs = (first + 15) / 16;
  const int64_t per = (packs + nblocks - 1) / nblocks;
  return (per < 1 ? 1 : per) * 16;
}

// Block b's byte range [lo, hi) of piece i, relative to the piece's start.
struct FusedCollSlice {
  int64_t off, lo, hi;  // off: the piece's start in a block of the caller's buffers
};

FASTPAR_HD FusedCollSlice fused_coll_slice_of(const FusedCollArgs& a, int64_t i, int b) {
  const int64_t off = i * a.piece;
  const int64_t rest = a.bytes - off;
  const int64_t len = rest < 0 ? 0 : rest < a.piece ? rest : a.piece;
  const int64_t lo = int64_t(b) * a.slice, hi = lo + a.slice;
  return {off, lo < len ? lo : len, hi < len ? hi : len};
}

// Rank q's slot of piece i, at region `region` (0 for the one-region kinds).
FASTPAR_HD char* fused_coll_slot(const FusedCollArgs& a, int q, int64_t i, int region) {
  const int k = int((a.first_slot + i) % flags::kSlots);
  return a.slot0[q] + k * a.slot_stride + int64_t(region) * a.stride;
}

// Block b's publish of piece i: what this rank sends, into its own slot.
FASTPAR_HD void fused_coll_publish(const FusedCollArgs& a, int64_t i, int b, int t, int nt) {
  const int r = a.phase.rank, n = a.phase.size;
  const FusedCollSlice s = fused_coll_slice_of(a, i, b);
  const int64_t len = s.hi - s.lo;
  if (len <= 0) return;
  auto send = [&](int region, const char* from) {
    fused_copy<uint8_t>(reinterpret_cast<uint8_t*>(fused_coll_slot(a, r, i, region) + s.lo),
                        reinterpret_cast<const uint8_t*>(from + s.off + s.lo), len, t, nt);
  };
  switch (a.kind) {
    case FusedColl::kBroadcast:
      if (r == a.root) send(0, a.src[0]);
      break;
    case FusedColl::kGather:
    case FusedColl::kReduce:
      if (a.root < 0 || r != a.root) send(0, a.src[0]);
      break;
    case FusedColl::kScatter:
      if (r != a.root) break;
      for (int q = 0; q < n; ++q)
        if (q != r) send(q, a.src[q]);
      break;
    case FusedColl::kAllToAll:
      for (int q = 0; q < n; ++q)
        if (q != r) send(q, a.src[q]);
      // Its own block straight across, before the phase: ins may alias outs
      // block for block, and this slice of src[q] was published above.
      fused_copy<uint8_t>(reinterpret_cast<uint8_t*>(a.dst[r] + s.off + s.lo),
                          reinterpret_cast<const uint8_t*>(a.src[r] + s.off + s.lo), len, t, nt);
      break;
    case FusedColl::kReduceScatter:
      for (int q = 0; q < n; ++q)
        if (q != r) send(q, a.src[q]);
      break;
    case FusedColl::kAllreduceRegistered:  // no slots (fused_registered_block)
      break;
  }
}

// Block b's read of piece i: what this rank receives, into its output.
template <typename T, ReduceOp OP>
FASTPAR_HD void fused_coll_read(const FusedCollArgs& a, int64_t i, int b, int t, int nt) {
  const int r = a.phase.rank, n = a.phase.size;
  const FusedCollSlice s = fused_coll_slice_of(a, i, b);
  const int64_t len = s.hi - s.lo;
  if (len <= 0) return;
  auto take = [&](char* to, const char* from) {
    fused_copy<uint8_t>(reinterpret_cast<uint8_t*>(to + s.off + s.lo), reinterpret_cast<const uint8_t*>(from), len,
                        t, nt);
  };
  switch (a.kind) {
    case FusedColl::kBroadcast:
      if (r != a.root) take(a.dst[0], fused_coll_slot(a, a.root, i, 0) + s.lo);
      break;
    case FusedColl::kGather:
      if (a.root >= 0 && r != a.root) break;
      for (int q = 0; q < n; ++q)
        take(a.dst[q], q == r ? a.src[0] + s.off + s.lo : fused_coll_slot(a, q, i, 0) + s.lo);
      break;
    case FusedColl::kScatter:
      take(a.dst[0], r == a.root ? a.src[r] + s.off + s.lo : fused_coll_slot(a, a.root, i, r) + s.lo);
      break;
    case FusedColl::kAllToAll:
      for (int q = 0; q < n; ++q)
        if (q != r) take(a.dst[q], fused_coll_slot(a, q, i, r) + s.lo);
      break;
    case FusedColl::kReduce:
    case FusedColl::kReduceScatter: {
      if (a.kind == FusedColl::kReduce && r != a.root) break;
      const bool scatter = a.kind == FusedColl::kReduceScatter;
      const T* src[kMaxIpcRanks];
      FASTPAR_FUSED_UNROLL
      for (int q = 0; q < kMaxIpcRanks; ++q)
        src[q] = q >= n ? nullptr
                 : q == r ? reinterpret_cast<const T*>(a.src[scatter ? r : 0] + s.off + s.lo)
                          : reinterpret_cast<const T*>(fused_coll_slot(a, q, i, scatter ? r : 0) + s.lo);
      T* const dst[1] = {reinterpret_cast<T*>(a.dst[0] + s.off + s.lo)};
      FusedReduce<T, OP>::template run<1, 1>(
          src, n, dst, 1, len / int64_t(sizeof(T)), a.contributions, t, nt);
      break;
    }
    case FusedColl::kAllreduceRegistered:  // no slots (fused_registered_block)
      break;
  }
}

// The registered all_reduce as a push: the data already sits in every rank's
// registered buffer, which every peer maps, so there is no copy-in and no
// slot. Rank r owns shard r ([r * piece, (r + 1) * piece) bytes, clamped:
// the count cut in n, 64-byte aligned as allreduce_slots.h's shards); after
// phase 0 (every rank has reached the call, so its buffer holds its data:
// each rank's kernel starts after its stream's earlier work), block b of the
// owner reduces slice b of the shard from every rank's buffer in rank order
// and writes the result into every rank's buffer, its own included; phase 1
// keeps every rank's buffer from going back to its stream before every owner
// has written into it (a rank's kernel ends after all its blocks passed phase
// 1, so after block b of every peer has, for every b). Only the owner of a
// shard reads or writes it during the call, so the buffers need no other
// order. Per rank N bytes, the k ranks move 2kN bytes (n reads and n writes
// of each element), where the step-by-step form moves (3k-1)N; the bits are
// its bits (the same shards reduced in rank order).
FASTPAR_HD FusedCollSlice fused_registered_slice_of(const FusedCollArgs& a, int b) {
  const int64_t r = a.phase.rank;
  const int64_t sb = r * a.piece < a.bytes ? r * a.piece : a.bytes;
  const int64_t se = sb + a.piece < a.bytes ? sb + a.piece : a.bytes;
  const int64_t lo = sb + int64_t(b) * a.slice < se ? sb + int64_t(b) * a.slice : se;
  const int64_t hi = lo + a.slice < se ? lo + a.slice : se;
  return {0, lo, hi};
}

template <typename T, ReduceOp OP>
FASTPAR_HD void fused_registered_reduce(const FusedCollArgs& a, int b, int t, int nt) {
  const int n = a.phase.size;
  const FusedCollSlice s = fused_registered_slice_of(a, b);
  if (s.hi <= s.lo) return;
  const T* src[kMaxIpcRanks];
  T* dst[kMaxIpcRanks];
  FASTPAR_FUSED_UNROLL
  for (int q = 0; q < kMaxIpcRanks; ++q) {
    src[q] = q < n ? reinterpret_cast<const T*>(a.src[q] + s.lo) : nullptr;
    dst[q] = q < n ? reinterpret_cast<T*>(a.dst[q] + s.lo) : nullptr;
  }
  FusedReduce<T, OP>::template run<1, kMaxIpcRanks>(
      src, n, dst, n, (s.hi - s.lo) / int64_t(sizeof(T)), a.contributions, t, nt);
}

template <class Mem, typename T, ReduceOp OP, class Blk>
FASTPAR_HD void fused_registered_block(const FusedCollArgs& a, int b, Blk& blk) {
  if (blk.barrier(block_phase<Mem>(a.phase, a.self_blocks, a.peer_blocks, b, 0))) return;
  blk.threads([&](int t, int nt) { fused_registered_reduce<T, OP>(a, b, t, nt); });
  blk.barrier(block_phase<Mem>(a.phase, a.self_blocks, a.peer_blocks, b, 1));
}

// The whole call for block b (Blk as two_shot_block's: leader, threads, barrier).
// T and OP matter only to the reducing kinds; the copies move bytes.
template <class Mem, typename T, ReduceOp OP, class Blk>
FASTPAR_HD void fused_coll_block(const FusedCollArgs& a, int b, Blk& blk) {
  // An earlier call failed here: write nothing (block 0 tells the peers).
  if (blk.leader([&] { return fused_prior_failure<Mem>(a.phase, b) != 0; })) return;
  if (a.kind == FusedColl::kAllreduceRegistered) {
    fused_registered_block<Mem, T, OP>(a, b, blk);
    return;
  }
  for (int64_t i = 0; i < a.pieces; ++i) {
    blk.threads([&](int t, int nt) { fused_coll_publish(a, i, b, t, nt); });
    if (blk.barrier(block_phase<Mem>(a.phase, a.self_blocks, a.peer_blocks, b, i))) return;
    blk.threads([&](int t, int nt) { fused_coll_read<T, OP>(a, i, b, t, nt); });
  }
}

// Points `a` at `c`'s arenas: this rank's and the peers' block flags and
// slots. Host code.
inline void fused_coll_bind(FusedCollArgs& a, const IpcComm& c) {
  a.self_blocks = block_flags_of(c.bases[c.rank]);
  for (int q = 0; q < c.size; ++q) {
    a.peer_blocks[q] = block_flags_of(c.bases[q]);
    a.slot0[q] = slot_of(c.bases[q], c.slot_bytes, 0);
  }
  a.slot_stride = int64_t(slot_stride(c.slot_bytes));
}

// Enqueues the kernel (ipc_fused_collectives.cu): a.nblocks blocks. `dt` and
// `op` pick the reducing kinds' instance (the copy kinds ignore them).
cudaError_t launch_fused_collective(DType dt, ReduceOp op, const FusedCollArgs& a, cudaStream_t stream);

// Loads every instance of the kernel now (preload_kernels.h).
cudaError_t preload_fused_collective_kernels();

}  // namespace cuda_ipc
}  // namespace fastpar
