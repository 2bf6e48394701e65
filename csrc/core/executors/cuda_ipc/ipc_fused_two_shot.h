// The pipelined two-shot allreduce (core/algorithms/allreduce_slots.h,
// allreduce_two_shot) as ONE kernel per call, whatever the size: where the
// step-by-step schedule (IpcSteps) enqueues 2mn + 1 stream operations for m
// slot-sized chunks and n ranks (a copy kernel per peer shard, a one-thread
// phase kernel per phase), this kernel walks the same chunks and phases
// itself. NCCL's runRing, TensorRT-LLM's two-shot kernel and vLLM's one-shot
// do the same (a persistent kernel, flags between ranks inside it); the
// protocol below is the phase protocol of flag_protocol.h cut per block.
//
// Per-block slices. Chunk k's shard q is split_range(chunk, n, q) as the
// schedule cuts a full chunk, and block b owns slice b of every shard of
// every chunk (two_shot_cut: the shard cut in nblocks pieces of whole 16-byte
// packs; a shorter last chunk keeps the full chunks' cut). nblocks depends only on the count, dtype, rank count and
// IpcComm::fused_bytes_per_block, which every rank has alike, so slice b is
// the same elements on every rank. Per chunk, block b of rank r
//   publish   copies slice b of its input's shards q != r into its slot;
//   barrier   posts phase p on its block flag and waits for block b of every
//             peer to post p;
//   reduce    reduces slice b of shard r from every rank (its own input, the
//             peers' slots) in rank order into its slot and its output;
//   copy-out  one phase later, copies slice b of every other shard q from
//             rank q's slot (q's reduced shard) into its output.
// Every byte block b reads from a peer was written by block b of that peer
// before it posted the phase block b waited for, so block b only waits for
// block b: no grid-wide barrier, and blocks of one rank never wait for each
// other (a grid barrier would also deadlock where ranks share a GPU and not
// every block of every rank is resident). The pipeline is the schedule's:
// after phase P(k), copy out chunk k-1, reduce chunk k, publish chunk k+1
// (three rotating slots), so m chunks take m + 1 phases and every output
// element gets the schedule's bits (identical to allreduce_two_shot's).
//
// Memory ordering, per flag:
//   * block flag b (this rank's, written by thread 0 of block b with
//     st.release.sys after __syncthreads()): the block's slot writes (publish,
//     reduce) happen before it, so a peer's block b whose thread acquires it
//     (ld.acquire.sys, then __syncthreads_or() before its threads read) sees
//     them (a waiting thread per peer, or thread 0 for all: phase_step.h's
//     BlockPhase);
//   * slot reuse: block b rewrites a slot region (its slice) only after
//     waiting for a phase that block b of every peer posts after its last read
//     of that region: the protocol's rotation argument (flag_protocol.h) holds
//     per block because region b is only ever read by blocks b. Across calls
//     (another schedule, another block count) the kernel boundary orders
//     everything: a later call's flags are posted by a later launch, which
//     starts after every block of this one ended;
//   * block 0 also posts the control block's flag and descriptor at every
//     phase (flags::post) and waits with flags::wait_and_check: the
//     descriptor check of every phase stays, and a phase kernel or a fused
//     kernel of another schedule on a peer fails with kMismatch. Other blocks
//     do not compare descriptors; on a desync they may read a peer's slot
//     before block 0 has failed (within this rank's own chunk of the slot,
//     never past it) and the call's output is undefined, as with any failed call.
// Every wait has the phase protocol's deadline and polls (PhasePoll) the host
// abort word and every peer's abort word, and this rank's status word, so the
// other blocks stop as soon as one of them has failed. Failures are recorded as
// the phase kernel records them (record_failure: status word, host mirror,
// mismatch record, abort word; the first one wins); a launch that finds the
// status word set writes nothing.
//
// Data moves in 16-byte packs, kUnroll packs per thread in flight in the
// copies, the n sources of kUnroll packs in the reduction; an exact scalar
// loop does what is not whole packs or not 16-byte aligned, with the same
// order and math (reduce_ops.h: fp32 accumulation for half types).
//
// Written once over a memory-ordering policy (Mem) and a block policy (Blk:
// how the block's threads run the data loops, share thread 0's results and
// meet at the barriers), so the kernel (ipc_fused_two_shot.cu) and the host emulation,
// which runs every block on a thread of its own, run the same code.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "../../kernels/reduce_ops.h"
#include "../../transport/cuda_ipc/ipc_arena.h"
#include "../../transport/flag_protocol.h"
#include "fused_loops.h"
#include "ipc_graph.h"
#include "phase_step.h"

namespace fastpar {
namespace cuda_ipc {

// Blocks of a call of `count` elements of `es` bytes among `n` ranks, each
// block getting at least `per_block` bytes of a chunk's shard, at most `cap`
// (fused_grid_cap, ipc_comm.h: every rank's grid on a GPU resident at once).
// A function of what every rank has alike.
FASTPAR_HD int two_shot_blocks(int64_t count, int64_t es, int n, int64_t chunk, int64_t per_block, int cap) {
  if (per_block < 1) per_block = 1;
  if (n < 1) n = 1;
  const int64_t first = count < chunk ? count : chunk;
  const int64_t shard = (first * es + n - 1) / n;
  int64_t b = (shard + per_block - 1) / per_block;
  if (b > cap) b = cap;
  return int(b < 1 ? 1 : b);
}

struct TwoShotArgs {
  PhaseArgs phase;  // desc.seq: the call's first phase; phase j of the call is desc.seq + j
  FlagLine* self_blocks;
  const FlagLine* peer_blocks[kMaxIpcRanks];
  char* slot0[kMaxIpcRanks];  // every rank's slot 0; slot i at + i * slot_stride
  int64_t slot_stride;
  const void* in;                            // this rank's input (count elements)
  void* out;                                 // may be `in`
  int64_t count;
  int64_t chunk;  // elements per chunk (a slot's worth)
  int64_t chunks; // m: num_pieces(count, chunk), >= 1
  int first_slot; // the slot of chunk 0; chunk k's is (first_slot + k) % kSlots
  int contributions;  // the AVG divisor
  int nblocks;
};

// Element range [lo, hi) of block b's slice of chunk k's shard q, and the
// shard's start (the offset of slot data is index - chunk start).
struct TwoShotSlice {
  int64_t lo, hi, chunk_begin;
};

// The call's cut, the same for every chunk: shards of P elements (P =
// ring_schedule.h's split_range of a full chunk among n, aligned to 64 bytes
// as allreduce_slots.h's shard_align, so full chunks get the step-by-step
// schedule's shards), each cut in nblocks slices of S elements (whole 16-byte
// packs). A shorter last chunk keeps the cut, clamped to its end, instead of
// being cut anew: a block's region of a slot must be the same in every chunk
// of a call, or its rewrite of a slot three chunks later could hit a region
// a peer's other block is still reading (the wait is only on block b).
// Shard q, slice b of chunk k: [cb + qP + bS, cb + qP + (b+1)S) clamped to
// the shard and the chunk. Host and device.
template <typename T>
FASTPAR_HD void two_shot_cut(const TwoShotArgs& a, int64_t* shard, int64_t* slice) {
  constexpr int64_t V = 16 / int64_t(sizeof(T));
  const int64_t align = 64 / int64_t(sizeof(T)) > 1 ? 64 / int64_t(sizeof(T)) : 1;
  const int n = a.phase.size;
  const int64_t full = a.count < a.chunk ? a.count : a.chunk;
  int64_t per = (full + n - 1) / n;
  per = (per + align - 1) / align * align;
  *shard = per;
  const int64_t units = (per + V - 1) / V;
  *slice = (units + a.nblocks - 1) / a.nblocks * V;
}

template <typename T>
FASTPAR_HD void two_shot_shard(const TwoShotArgs& a, int64_t k, int q, int64_t* begin, int64_t* end) {
  int64_t P, S;
  two_shot_cut<T>(a, &P, &S);
  const int64_t cb = k * a.chunk;
  const int64_t ce = cb + a.chunk < a.count ? cb + a.chunk : a.count;
  const int64_t b = cb + P * q, e = b + P;
  *begin = b < ce ? b : ce;
  *end = e < ce ? e : ce;
}

template <typename T>
FASTPAR_HD TwoShotSlice two_shot_slice(const TwoShotArgs& a, int64_t k, int q, int b) {
  int64_t P, S;
  two_shot_cut<T>(a, &P, &S);
  const int64_t cb = k * a.chunk;
  int64_t sb, se;
  two_shot_shard<T>(a, k, q, &sb, &se);
  const int64_t start = cb + P * q + S * b;
  const int64_t lo = start < se ? start : se, hi = start + S < se ? start + S : se;
  return {lo, hi, cb};
}

FASTPAR_HD int two_shot_slot(const TwoShotArgs& a, int64_t k) { return int((a.first_slot + k) % flags::kSlots); }

// Rank q's slot of chunk k (base + stride: no runtime index into a 2-D
// parameter array, which would copy it to local memory). `off`: bytes past
// it where this call's slot starts (the graphed kernel's parity; 0 otherwise).
template <typename T>
FASTPAR_HD T* two_shot_slot_ptr(const TwoShotArgs& a, int q, int64_t k, int64_t off = 0) {
  return reinterpret_cast<T*>(a.slot0[q] + two_shot_slot(a, k) * a.slot_stride + off);
}

// Block b's publish of chunk k: slice b of the input's shards q != rank into
// this rank's slot of chunk k.
template <typename T>
FASTPAR_HD void two_shot_publish(const TwoShotArgs& a, int64_t k, int b, int t, int nt, int64_t off = 0) {
  const int r = a.phase.rank;
  T* slot = two_shot_slot_ptr<T>(a, r, k, off);
  const T* in = static_cast<const T*>(a.in);
  for (int q = 0; q < a.phase.size; ++q) {
    if (q == r) continue;
    const TwoShotSlice s = two_shot_slice<T>(a, k, q, b);
    fused_copy<T>(slot + (s.lo - s.chunk_begin), in + s.lo, s.hi - s.lo, t, nt);
  }
}

// Block b's copy-out of chunk k: slice b of every other rank's reduced shard,
// from that rank's slot of chunk k, into the output.
template <typename T>
FASTPAR_HD void two_shot_copy_out(const TwoShotArgs& a, int64_t k, int b, int t, int nt, int64_t off = 0) {
  const int r = a.phase.rank;
  T* out = static_cast<T*>(a.out);
  for (int q = 0; q < a.phase.size; ++q) {
    if (q == r) continue;
    const TwoShotSlice s = two_shot_slice<T>(a, k, q, b);
    fused_copy<T>(out + s.lo, two_shot_slot_ptr<const T>(a, q, k, off) + (s.lo - s.chunk_begin), s.hi - s.lo,
                     t, nt);
  }
}

// Block b's reduction of chunk k: slice b of shard `rank` from every rank
// (this rank's input, the peers' slots) in rank order into this rank's slot
// and the output (fused_loops.h: the reduce kernel's bits).
template <typename T, ReduceOp OP>
FASTPAR_HD void two_shot_reduce(const TwoShotArgs& a, int64_t k, int b, int t, int nt, int64_t slot_off = 0) {
  const int n = a.phase.size, r = a.phase.rank;
  const TwoShotSlice s = two_shot_slice<T>(a, k, r, b);
  const int64_t off = s.lo - s.chunk_begin;
  const T* src[kMaxIpcRanks];
  FASTPAR_FUSED_UNROLL
  for (int q = 0; q < kMaxIpcRanks; ++q)
    src[q] = q >= n ? nullptr : q == r ? static_cast<const T*>(a.in) + s.lo : two_shot_slot_ptr<const T>(a, q, k, slot_off) + off;
  T* const dst[2] = {two_shot_slot_ptr<T>(a, r, k, slot_off) + off, static_cast<T*>(a.out) + s.lo};
  FusedReduce<T, OP>::template run<1, 2>(src, n, dst, 2, s.hi - s.lo,
                                                                          a.contributions, t, nt);
}

// The whole call for block b. Blk supplies
//   bool leader(f):   the block's threads synchronized, f() run by thread 0,
//                     its result seen by every thread (synchronized again);
//   void threads(f):  f(t, nt) for each thread t of the block's nt;
//   bool barrier(ph): a phase object's (phase_step.h) arrive() on thread 0
//                     and its wait(q, deadline) for every peer q (a thread
//                     per peer, or thread 0 in turn), between two block
//                     synchronizations; true when any failed.
// On the GPU (gpu_block.cuh) the first synchronization orders the block's
// writes before thread 0's release, the last the waits' acquires before the
// block's reads.
template <class Mem, typename T, ReduceOp OP, class Blk>
FASTPAR_HD void two_shot_block(const TwoShotArgs& a, int b, Blk& blk) {
  // An earlier call failed here: write nothing (block 0 tells the peers).
  if (blk.leader([&] { return fused_prior_failure<Mem>(a.phase, b) != 0; })) return;
  blk.threads([&](int t, int nt) { two_shot_publish<T>(a, 0, b, t, nt); });
  for (int64_t k = 0; k < a.chunks; ++k) {
    if (blk.barrier(block_phase<Mem>(a.phase, a.self_blocks, a.peer_blocks, b, k))) return;
    blk.threads([&](int t, int nt) {
      if (k > 0) two_shot_copy_out<T>(a, k - 1, b, t, nt);
      two_shot_reduce<T, OP>(a, k, b, t, nt);
      if (k + 1 < a.chunks) two_shot_publish<T>(a, k + 1, b, t, nt);
    });
  }
  if (blk.barrier(block_phase<Mem>(a.phase, a.self_blocks, a.peer_blocks, b, a.chunks))) return;
  blk.threads([&](int t, int nt) { two_shot_copy_out<T>(a, a.chunks - 1, b, t, nt); });
}

// Enqueues the kernel (ipc_fused_two_shot.cu): a.nblocks blocks.
cudaError_t launch_fused_two_shot(DType dt, ReduceOp op, const TwoShotArgs& a, cudaStream_t stream);

// ---------------------------------------------------------------- the two-shot a CUDA graph can capture
//
// ipc_graph.h: the epoch, the flags 2e + j, the graph slot of the epoch's
// parity, the descriptor, the failure word. A graphed call fits one slot, so
// it is one chunk: publish, phase 0, reduce, phase 1, copy-out, on the eager
// call's grid (two_shot_blocks) and cut (two_shot_cut), so the same bits.
// Slot reuse needs no third phase: the next call to write graph slot e % 2
// is e + 2 (ipc_graph.h).

struct GraphTwoShotArgs {
  TwoShotArgs t;  // chunks = 1, first_slot = 0, slot0 = every rank's graph slot 0; block flags unused
  GraphRegion g;
};

template <class Mem, typename T, ReduceOp OP, class Blk>
FASTPAR_HD void graph_two_shot_block(const GraphTwoShotArgs& a, int b, Blk& blk) {
  if (!blk.leader([&] { return graph_prior_failure<Mem>(a.t.phase, a.g, b) != 0; })) {
    blk.threads([&](int t, int nt) { two_shot_publish<T>(a.t, 0, b, t, nt, graph_slot_offset(a.g, graph_epoch(a.g))); });
    if (!blk.barrier(GraphPhase<Mem>{a.t.phase, a.g, b, graph_epoch(a.g), 0})) {
      blk.threads(
          [&](int t, int nt) { two_shot_reduce<T, OP>(a.t, 0, b, t, nt, graph_slot_offset(a.g, graph_epoch(a.g))); });
      if (!blk.barrier(GraphPhase<Mem>{a.t.phase, a.g, b, graph_epoch(a.g), 1}))
        blk.threads([&](int t, int nt) {
          two_shot_copy_out<T>(a.t, 0, b, t, nt, graph_slot_offset(a.g, graph_epoch(a.g)));
        });
    }
  }
  blk.leader([&] {
    graph_finish<Mem>(a.g, a.t.nblocks);
    return false;
  });
}

// Enqueues the graphed kernel (ipc_fused_two_shot.cu): a.t.nblocks blocks.
cudaError_t launch_graph_two_shot(DType dt, ReduceOp op, const GraphTwoShotArgs& a, cudaStream_t stream);

// Loads every instance of the kernel now (preload_kernels.h).
cudaError_t preload_fused_two_shot_kernels();

}  // namespace cuda_ipc
}  // namespace fastpar
