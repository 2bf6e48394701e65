// The one-shot allreduce in ONE kernel when the data fits a slot: copy-in,
// the cross-rank barrier and the reduction, where the unfused schedule
// (ipc_allreduce.cpp) takes three launches (cudaMemcpyAsync, the one-thread
// phase kernel, the reduce kernel). The idea is vLLM's custom allreduce
// (per-block flags with system-scope release/acquire, so no grid-wide
// barrier is needed); the code and the protocol details are ours.
//
// Per-block barrier. The elements are cut into `nblocks` contiguous ranges
// (fused_range), the same on every rank because nblocks and the cut depend
// only on the element count and dtype, which the descriptor makes equal.
// Block b of every rank copies range b of its input into its slot, then
// posts its block flag b = seq (ipc_arena.h, block_flags_of; thread 0, after
// the block's copy-in) and waits for every peer's block flag b >= seq (a
// thread per peer, or thread 0 in turn: phase_step.h's BlockPhase); then the
// block reduces range b from every rank's slot (its own included). A block
// only ever reads the range the peers' block b published, so blocks of one
// grid never wait for each other: no co-residency is needed within a rank.
//
// Descriptor and abort semantics stay the phase protocol's: block 0 also
// posts the control block's flag with the call's descriptor (flags::post,
// after its block flag) and checks every peer's descriptor (wait_and_check),
// so a desynced peer (another op, count, dtype or a phase-kernel call) fails
// with kMismatch, and the next phase-kernel call (flag seq + 1) stays in
// order. Every wait polls the host abort word, every peer's abort word and
// this rank's status word (OwnStatusPoll) and has the deadline; a failure
// writes the status word, its host mirror and this rank's abort word, the
// first failure of the rank winning (record_failure: a block that gave up on
// a peer's abort does not bury block 0's mismatch). Blocks other than 0 do
// not compare descriptors: on a desync they may reduce before block 0 has
// failed (the output is then undefined, as with any failed call), but they
// only read within this rank's own count of a peer's slot, and the call
// still fails on every rank. Where the desynced ranks cut their data into
// different block ranges (counts that the grid cuts otherwise, or a peer in
// a two-shot), such a read may meet the peer's copy-in: a race whose only effect
// is that undefined output (the host emulation's ThreadSanitizer build leaves
// these desyncs out).
//
// Data moves in 16-byte packs when every pointer is 16-byte aligned, with the
// other one-kernel collectives' loops (fused_loops.h): the copy-in keeps 4
// packs per thread in flight, the reduction loads its packs from every rank
// before combining (2 packs of each of up to 4 ranks, 1 of each of more);
// block ranges are whole packs (fused_range), an exact scalar loop does the
// tail and misaligned buffers (a view at an odd storage offset), with the
// same order and math, so the bits are the same.
//
// Written once over a memory-ordering policy (Mem) and a block policy (Blk,
// as the fused two-shot's: leader, threads, barrier), so the kernel
// (ipc_fused_one_shot.cu) and the host emulation, which runs every block on a
// thread of its own (started in reverse order and staggered, since the GPU
// runs them in any order and at once), run the same code.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "../../transport/flag_protocol.h"
#include "../../kernels/reduce_ops.h"
#include "../../transport/cuda_ipc/ipc_arena.h"
#include "fused_loops.h"
#include "ipc_graph.h"
#include "phase_step.h"

namespace fastpar {
namespace cuda_ipc {

// A block gets at least IpcComm::fused_bytes_per_block bytes (16 KiB):
// below it, a block's flag round trip costs more than its share of the copy.

// Blocks for `bytes` at `per_block` bytes per block (IpcComm's, equal on
// every rank): a function of the call's size only.
FASTPAR_HD int fused_blocks(int64_t bytes, int64_t per_block) {
  if (per_block < 1) per_block = 1;
  const int64_t b = (bytes + per_block - 1) / per_block;
  return int(b < 1 ? 1 : (b > kFusedMaxBlocks ? kFusedMaxBlocks : b));
}

// The grid of a fused one-shot call (eager or graphed): fused_blocks, at
// most `cap` (fused_grid_cap, ipc_comm.h: every rank's grid on a GPU
// resident at once at one block per SM), at least 1. Equal on every rank.
FASTPAR_HD int fused_one_shot_blocks(int64_t bytes, int64_t per_block, int cap) {
  const int b = fused_blocks(bytes, per_block);
  return b < cap ? b : (cap < 1 ? 1 : cap);
}

// Block b's element range [*begin, *end) of count elements cut in nblocks,
// each start a multiple of `align` elements (16 bytes: the slot's alignment).
FASTPAR_HD void fused_range(int64_t count, int nblocks, int b, int64_t align, int64_t* begin, int64_t* end) {
  const int64_t units = (count + align - 1) / align;
  const int64_t per = (units + nblocks - 1) / nblocks;
  const int64_t lo = int64_t(b) * per * align, hi = (int64_t(b) + 1) * per * align;
  *begin = lo < count ? lo : count;
  *end = hi < count ? hi : count;
}

struct FusedArgs {
  PhaseArgs phase;                             // control blocks, status, host words, descriptor, rank, size, timeout
  FlagLine* self_blocks;                       // this rank's block flags (block_flags_of)
  const FlagLine* peer_blocks[kMaxIpcRanks];   // every rank's
  const void* in;                              // this rank's input (count elements)
  void* out;                                   // may be `in`
  void* slots[kMaxIpcRanks];                   // every rank's slot of this call (slots[rank] is written)
  int64_t count;
  int contributions;                           // the AVG divisor
  int nblocks;
};

// Block b's range [*lo, *hi), cut in whole packs.
template <typename T>
FASTPAR_HD void fused_block_range(const FusedArgs& a, int b, int64_t* lo, int64_t* hi) {
  fused_range(a.count, a.nblocks, b, 16 / int64_t(sizeof(T)), lo, hi);
}

// Block b's copy-in, thread `t` of `nt` (fused_copy: 4 packs in flight).
// `slot_off`: bytes past a.slots[q] where this call's slots start (the
// graphed kernel's parity; 0 otherwise).
template <typename T>
FASTPAR_HD void fused_copy_in(const FusedArgs& a, int b, int t, int nt, int64_t slot_off = 0) {
  int64_t lo, hi;
  fused_block_range<T>(a, b, &lo, &hi);
  T* mine = reinterpret_cast<T*>(static_cast<char*>(a.slots[a.phase.rank]) + slot_off);
  fused_copy<T>(mine + lo, static_cast<const T*>(a.in) + lo, hi - lo, t, nt);
}

// Block b's reduction in rank order 0..n-1 (the reduce kernel's order and
// math, reduce_ops.h: identical bits), thread `t` of `nt`. Every source is a
// slot, this rank's own too (the block's copy-in, ordered before by the
// barrier). FusedReduce (fused_loops.h).
template <typename T, ReduceOp OP, int U = kFusedReduceUnroll<T>>
FASTPAR_HD void fused_reduce(const FusedArgs& a, int b, int t, int nt, int64_t slot_off = 0) {
  int64_t lo, hi;
  fused_block_range<T>(a, b, &lo, &hi);
  const T* src[kMaxIpcRanks];
  FASTPAR_FUSED_UNROLL
  for (int q = 0; q < kMaxIpcRanks; ++q)
    src[q] = q < a.phase.size ? reinterpret_cast<const T*>(static_cast<const char*>(a.slots[q]) + slot_off) + lo
                              : nullptr;
  T* const dst[1] = {static_cast<T*>(a.out) + lo};
  FusedReduce<T, OP>::template run<U, 1>(src, a.phase.size, dst, 1, hi - lo,
                                                                      a.contributions, t, nt);
}

// The whole call for block b: copy-in, barrier (phase desc.seq), reduction.
template <class Mem, typename T, ReduceOp OP, class Blk>
FASTPAR_HD void one_shot_block(const FusedArgs& a, int b, Blk& blk) {
  // An earlier call failed here: write nothing (the host raises it).
  if (blk.leader([&] { return fused_prior_failure<Mem>(a.phase, b) != 0; })) return;
  blk.threads([&](int t, int nt) { fused_copy_in<T>(a, b, t, nt); });
  if (blk.barrier(block_phase<Mem>(a.phase, a.self_blocks, a.peer_blocks, b, 0))) return;
  blk.threads([&](int t, int nt) { fused_reduce<T, OP>(a, b, t, nt); });
}

// Enqueues the fused kernel (ipc_fused_one_shot.cu): a.nblocks blocks.
cudaError_t launch_fused_one_shot(DType dt, ReduceOp op, const FusedArgs& a, cudaStream_t stream);

// ---------------------------------------------------------------- the one-shot a CUDA graph can capture
//
// ipc_graph.h: the epoch, the flags 2e + j, the graph slot of the epoch's
// parity, the descriptor, the failure word. The one-shot replay has one
// barrier (phase 0) and runs the eager call's grid (fused_blocks).

struct GraphArgs {
  FusedArgs f;  // in, out, count, nblocks, contributions; slots = every rank's graph slot 0; block flags unused
                // (GraphControl::start are the graphed calls')
  GraphRegion g;
};

// The whole graphed call for block b: the earlier-failure check, the copy-in
// to the epoch's graph slot, the barrier, the reduction, then graph_finish
// (every block, failed or not).
template <class Mem, typename T, ReduceOp OP, class Blk>
FASTPAR_HD void graph_block(const GraphArgs& a, int b, Blk& blk) {
  if (!blk.leader([&] { return graph_prior_failure<Mem>(a.f.phase, a.g, b) != 0; })) {
    blk.threads([&](int t, int nt) { fused_copy_in<T>(a.f, b, t, nt, graph_slot_offset(a.g, graph_epoch(a.g))); });
    if (!blk.barrier(GraphPhase<Mem>{a.f.phase, a.g, b, graph_epoch(a.g), 0}))
      blk.threads(
          [&](int t, int nt) { fused_reduce<T, OP, 1>(a.f, b, t, nt, graph_slot_offset(a.g, graph_epoch(a.g))); });
  }
  blk.leader([&] {
    graph_finish<Mem>(a.g, a.f.nblocks);
    return false;
  });
}

// Enqueues the graphed kernel (ipc_fused_one_shot.cu): a.f.nblocks blocks.
cudaError_t launch_fused_graph(DType dt, ReduceOp op, const GraphArgs& a, cudaStream_t stream);

// Loads every fused and graphed kernel now (see cuda_kernels::preload_reduce_kernels).
cudaError_t preload_fused_kernels();


}  // namespace cuda_ipc
}  // namespace fastpar
