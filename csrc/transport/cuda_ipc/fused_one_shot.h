// The one-shot allreduce in ONE kernel when the data fits a slot: copy-in,
// the cross-rank barrier and the reduction, where the unfused schedule
// (allreduce_ipc.cpp) takes three launches (cudaMemcpyAsync, the one-thread
// phase kernel, the reduce kernel). The idea is vLLM's custom allreduce
// (per-block flags with system-scope release/acquire, so no grid-wide
// barrier is needed); the code and the protocol details are ours.
//
// Per-block barrier. The elements are cut into `nblocks` contiguous ranges
// (fused_range), the same on every rank because nblocks and the cut depend
// only on the element count and dtype, which the descriptor makes equal.
// Block b of every rank copies range b of its input into its slot, then
// (thread 0, after __syncthreads) release-stores its block flag b = seq and
// waits for every peer's block flag b >= seq; then the block reduces range b
// from every rank's slot (its own input for itself). A block only ever reads
// the range the peers' block b published, so blocks of one grid never wait
// for each other: no co-residency is needed within a rank.
//
// Descriptor and abort semantics stay the phase protocol's: block 0 also
// posts the control block's flag with the call's descriptor (flags::post,
// after its block flag) and checks every peer's descriptor (wait_and_check),
// so a desynced peer (another op, count, dtype or a phase-kernel call) fails
// with kMismatch, and the next phase-kernel call (flag seq + 1) stays in
// order. Every wait polls the host abort word and every peer's abort word
// (PhasePoll) and has the deadline; a failure writes the status word, its
// host mirror and this rank's abort word. Blocks other than 0 do not compare
// descriptors: on a desync they may reduce before block 0 has failed (the
// output is then undefined, as with any failed call), but they only read
// within this rank's own count of a peer's slot, and the call still fails on
// every rank.
//
// Written once over a memory-ordering policy for the kernel
// (fused_one_shot.cu) and the host emulation, which runs blocks one after the
// other per rank thread (every rank walks its blocks in the same order, so
// block b's barrier always finds its peers' block b).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "../../algorithms/flag_protocol.h"
#include "../../kernels/reduce_ops.h"
#include "ipc_arena.h"
#include "phase_step.h"

namespace fastpar {
namespace cuda_ipc {

// Block flags live in the arena header, after the control block and the
// status word (zeroed with the header at allocation).
constexpr size_t kBlockFlagsOffset = 320;
static_assert(sizeof(flags::ControlBlock) + sizeof(uint32_t) <= kBlockFlagsOffset, "block flags overlap");
static_assert(kBlockFlagsOffset + kFusedMaxBlocks * sizeof(uint64_t) <= kHeaderBytes, "block flags overflow");
// A block gets at least IpcComm::fused_bytes_per_block bytes (16 KiB):
// below it, a block's flag round trip costs more than its share of the copy.

FASTPAR_HD uint64_t* block_flags_of(void* base) {
  return reinterpret_cast<uint64_t*>(static_cast<char*>(base) + kBlockFlagsOffset);
}

// Blocks for `bytes` at `per_block` bytes per block (IpcComm's, equal on
// every rank): a function of the call's size only.
FASTPAR_HD int fused_blocks(int64_t bytes, int64_t per_block) {
  if (per_block < 1) per_block = 1;
  const int64_t b = (bytes + per_block - 1) / per_block;
  return int(b < 1 ? 1 : (b > kFusedMaxBlocks ? kFusedMaxBlocks : b));
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
  uint64_t* self_blocks;                       // this rank's block flags
  const uint64_t* peer_blocks[kMaxIpcRanks];   // every rank's
  const void* in;                              // this rank's input (count elements)
  void* out;                                   // may be `in`
  void* slots[kMaxIpcRanks];                   // every rank's slot of this call (slots[rank] is written)
  int64_t count;
  int contributions;                           // the AVG divisor
  int nblocks;
};

template <class Mem, class Poll>
FASTPAR_HD flags::WaitStatus fused_wait_flag(const uint64_t* word, uint64_t seq, uint64_t deadline, const Poll& poll) {
  for (;;) {
    for (int i = 0; i < flags::kPollSpins; ++i) {
      if (Mem::load_acquire(word) >= seq) return flags::WaitStatus::kOk;
      Mem::pause();
    }
    const flags::WaitStatus s = poll();  // the host abort word and every peer's abort word
    if (s != flags::WaitStatus::kOk) return s;
    if (Mem::now_ns() > deadline) return Mem::load_acquire(word) >= seq ? flags::WaitStatus::kOk : flags::WaitStatus::kTimeout;
  }
}

// Thread 0 of block b, once the block's copy-in is done (__syncthreads):
// arrive, then wait for block b of every peer. Returns the failure, if any,
// already recorded (status word, mirror, abort word).
template <class Mem>
FASTPAR_HD flags::WaitStatus fused_block_barrier(const FusedArgs& a, int b) {
  const PhaseArgs& p = a.phase;
  Mem::store_release(&a.self_blocks[b], p.desc.seq);
  if (b == 0) flags::post<Mem>(p.self, p.desc);
  const uint64_t deadline = flags::deadline_after(Mem::now_ns(), p.timeout_ns);
  const PhasePoll<Mem> poll{&p};
  flags::WaitStatus s = flags::WaitStatus::kOk;
  flags::OpDesc theirs{};
  int q = 0;
  for (; q < p.size && s == flags::WaitStatus::kOk; ++q) {
    if (q == p.rank) continue;
    if (b == 0) {
      s = flags::wait_and_check<Mem>(p.peers[q], p.desc, deadline, poll, &theirs);
    } else {
      if (Mem::load_acquire(&p.peers[q]->abort) != 0) s = flags::WaitStatus::kPeerAborted;
      else s = fused_wait_flag<Mem>(&a.peer_blocks[q][b], p.desc.seq, deadline, poll);
    }
  }
  if (s != flags::WaitStatus::kOk) record_failure<Mem>(p, s, q - 1, &theirs);
  return s;
}

// Block b's copy-in, thread `t` of `nt`.
template <typename T>
FASTPAR_HD void fused_copy_in(const FusedArgs& a, int b, int t, int nt) {
  int64_t lo, hi;
  fused_range(a.count, a.nblocks, b, 16 / int64_t(sizeof(T)) > 0 ? 16 / int64_t(sizeof(T)) : 1, &lo, &hi);
  const T* in = static_cast<const T*>(a.in);
  T* mine = static_cast<T*>(a.slots[a.phase.rank]);
  for (int64_t i = lo + t; i < hi; i += nt) mine[i] = in[i];
}

// Block b's reduction in rank order 0..n-1 (the reduce kernel's order and
// math, reduce_ops.h: identical bits), thread `t` of `nt`.
template <typename T, ReduceOp OP>
FASTPAR_HD void fused_reduce(const FusedArgs& a, int b, int t, int nt) {
  int64_t lo, hi;
  fused_range(a.count, a.nblocks, b, 16 / int64_t(sizeof(T)) > 0 ? 16 / int64_t(sizeof(T)) : 1, &lo, &hi);
  const int n = a.phase.size, r = a.phase.rank;
  T* out = static_cast<T*>(a.out);
  for (int64_t i = lo + t; i < hi; i += nt) {
    T x[kMaxIpcRanks];
    for (int q = 0; q < n; ++q) x[q] = q == r ? static_cast<const T*>(a.in)[i] : static_cast<const T*>(a.slots[q])[i];
    acc_t<T> acc = load_acc(x[0]);
    for (int q = 1; q < n; ++q) acc = combine<OP>(acc, load_acc(x[q]));
    out[i] = store_acc<T>(finalize<OP>(acc, a.contributions));
  }
}

// Enqueues the fused kernel (fused_one_shot.cu): a.nblocks blocks.
cudaError_t launch_fused_one_shot(DType dt, ReduceOp op, const FusedArgs& a, cudaStream_t stream);

// ---------------------------------------------------------------- the all_reduce a CUDA graph can capture
//
// A captured kernel replays with the arguments it had at capture, so nothing
// it does may depend on a host counter, as the kernel above does (its phase
// number, its turn in the slot rotation). This variant keeps its state in the
// arena's graph region (ipc_arena.h: GraphControl and one graph slot):
//   * block b reads its epoch (the graphed calls its rank's block b has
//     completed) from its own GraphControl and works on epoch + 1, so every
//     replay is a new call. Ranks stay in step because every rank runs the
//     same sequence of graphed calls, each with the same block count (a
//     function of the size, which the descriptor makes equal);
//   * one fixed slot, made safe to reuse by a second barrier: after its
//     reads, block b posts end[b] and waits for every peer's, so no rank's
//     next copy-in overwrites data a peer is still reading;
//   * block 0 writes the call's descriptor (seq = the epoch) before its start
//     flag and compares every peer's after acquiring theirs: a desynced
//     graphed call fails with kMismatch. A graphed call on one rank against
//     an eager one on another waits for flags the other never posts: both
//     fail at the timeout, or as soon as one gives up (the abort words).
// Failures are recorded as in the kernel above (status word, host mirror,
// abort word), and every later kernel of the communicator does nothing.
// Every wait polls the host abort word, so the peer watcher stops a replay
// waiting on a dead peer.

struct GraphArgs {
  FusedArgs f;  // in, out, count, nblocks, contributions; slots = every rank's graph slot; block flags unused
  GraphControl* self;
  const GraphControl* peers[kMaxIpcRanks];
};

// Thread 0 of block b, epoch e: the start barrier (is_start: after the
// block's copy-in) or the end barrier (after its reads). Returns the failure,
// if any, already recorded.
template <class Mem>
FASTPAR_HD flags::WaitStatus graph_block_barrier(const GraphArgs& a, int b, uint64_t e, bool is_start) {
  const PhaseArgs& p = a.f.phase;
  flags::OpDesc mine = p.desc;
  mine.seq = e;
  if (is_start && b == 0) a.self->desc = mine;  // published by the release below
  Mem::store_release(is_start ? &a.self->start[b].value : &a.self->end[b].value, e);
  const uint64_t deadline = flags::deadline_after(Mem::now_ns(), p.timeout_ns);
  const PhasePoll<Mem> poll{&p};
  flags::WaitStatus s = flags::WaitStatus::kOk;
  flags::OpDesc theirs{};
  int q = 0;
  for (; q < p.size && s == flags::WaitStatus::kOk; ++q) {
    if (q == p.rank) continue;
    const uint64_t* w = is_start ? &a.peers[q]->start[b].value : &a.peers[q]->end[b].value;
    s = fused_wait_flag<Mem>(w, e, deadline, poll);
    // The peer cannot rewrite its descriptor before our end flag of epoch e.
    if (s == flags::WaitStatus::kOk && is_start && b == 0) {
      theirs = a.peers[q]->desc;
      if (!flags::same_call(mine, theirs)) s = flags::WaitStatus::kMismatch;
    }
  }
  if (s != flags::WaitStatus::kOk) record_failure<Mem>(p, s, q - 1, &theirs);
  return s;
}

// Block b's epoch for this call (thread 0 reads it before the copy-in; only
// block b of this rank ever writes it, after its end barrier).
FASTPAR_HD uint64_t graph_epoch(const GraphArgs& a, int b) { return a.self->epoch[b].value + 1; }
FASTPAR_HD void graph_done(const GraphArgs& a, int b, uint64_t e) { a.self->epoch[b].value = e; }

// Enqueues the graphed kernel (fused_one_shot.cu): a.f.nblocks blocks.
cudaError_t launch_fused_graph(DType dt, ReduceOp op, const GraphArgs& a, cudaStream_t stream);

// Loads every fused and graphed kernel now (see cuda_kernels::preload_reduce_kernels).
cudaError_t preload_fused_kernels();

}  // namespace cuda_ipc
}  // namespace fastpar
