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
// different block ranges (the graphed kernel below, or a peer in the fused
// two-shot), such a read may meet the peer's copy-in: a race whose only effect
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
template <typename T, ReduceOp OP, int U = kFusedReduceUnroll>
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

// ---------------------------------------------------------------- the all_reduce a CUDA graph can capture
//
// A captured kernel replays with the arguments it had at capture, so nothing
// it does may depend on a host counter, as the kernel above does (its phase
// number, its turn in the slot rotation). This variant keeps its state in the
// arena's graph region (ipc_arena.h: GraphControl and two graph slots):
//   * block b reads its epoch (the graphed calls its rank's block b has
//     completed) from its own GraphControl and works on epoch + 1, so every
//     replay is a new call. Every graphed call runs kFusedMaxBlocks blocks
//     (blocks past the data only meet at the barrier), so every block of a
//     rank has the same epoch, and ranks stay in step because every rank
//     runs the same sequence of graphed calls;
//   * epoch e copies in to graph slot e % 2, so a replay needs one barrier,
//     not two: a rank's next replay (e + 1) writes the other slot, and the
//     one after (e + 2) starts on its stream after every block of this rank
//     passed the barrier of e + 1, which block b of every peer posts only
//     after its reads of epoch e. With one slot, a second barrier after the
//     reads was needed before the next copy-in;
//   * block 0 writes the call's descriptor (seq = the epoch) in desc[e % 2]
//     before its start flag and compares every peer's after acquiring
//     theirs: a desynced graphed call fails with kMismatch. A peer rewrites
//     desc[e % 2] only at e + 2, after our flag of e + 1, which we post after
//     this comparison.
// Graphed and eager calls have separate flags and slots, but on a rank's
// stream they run in the order enqueued, so that combined order must be the
// same on every rank. Rank 0 replaying G then calling E while rank 1 calls
// E then replays G is a deadlock (each waits for flags the other posts only
// after its own wait): both fail at the timeout, or as soon as one gives up
// (the abort words); nothing is reduced from unposted data. And replays must not
// run at once (two graphs holding these calls replayed on two streams, or
// on parallel branches of one graph): they would share the epochs and the
// graph slots, overwrite each other's copy-in, and with equal
// descriptors (same size, dtype and op) nothing notices the wrong results.
//
// Failures are recorded as in the kernel above (status word, host mirror,
// abort word). A replay never calls into the host backend, so it cannot
// raise; and a trap would end the process's CUDA context (under MPS, every
// client's on the GPU). So a replay that fails, or that finds an earlier
// failure, also sets the failure word (IpcComm::host_replay_failure,
// graph_failed) and returns without writing: the host's next call on this
// communicator raises, naming the replay (ipc_failure.h). Every wait polls
// the host abort word, so the peer watcher stops a replay waiting on a dead
// peer.

struct GraphArgs {
  FusedArgs f;  // in, out, count, nblocks, contributions; slots = every rank's graph slot 0; block flags unused
                // (GraphControl::start are the graphed calls')
  int64_t parity_stride;  // bytes from graph slot 0 to graph slot 1
  GraphControl* self;
  const GraphControl* peers[kMaxIpcRanks];
  uint32_t* replay_failure;  // IpcComm::host_replay_failure, or null
};

// Bytes from graph slot 0 to the slot of epoch e.
FASTPAR_HD int64_t graph_slot_offset(const GraphArgs& a, uint64_t e) { return int64_t(e & 1u) * a.parity_stride; }

// A replay that failed (`status`, recorded) or found the status word
// already set: the failure word takes the status, for the host.
template <class Mem>
FASTPAR_HD void graph_failed(const GraphArgs& a, uint32_t status) {
  if (a.replay_failure != nullptr && status != 0) Mem::store_release_u32(a.replay_failure, status);
}

// fused_prior_failure for the graphed kernel: block 0 also sets the failure
// word; every block returns without writing.
template <class Mem>
FASTPAR_HD uint32_t graph_prior_failure(const GraphArgs& a, int b) {
  const uint32_t s = fused_prior_failure<Mem>(a.f.phase, b);
  if (s != 0 && b == 0) graph_failed<Mem>(a, s);
  return s;
}

// Block b's barrier of epoch e (a phase object, phase_step.h): arrive
// (block 0 first writes the call's descriptor, seq = e, in desc[e % 2],
// published by the release), and the wait for peer q, which block 0 follows
// with the comparison of q's descriptor. A failure is recorded, the failure
// word included (graph_failed).
template <class Mem>
struct GraphPhase {
  const PhaseArgs& p;
  const GraphArgs& a;
  int b;
  uint64_t e;

  FASTPAR_HD flags::OpDesc mine() const {
    flags::OpDesc d = p.desc;
    d.seq = e;
    return d;
  }

  FASTPAR_HD bool arrive() const {
    if (b == 0) a.self->desc[e & 1u] = mine();
    Mem::store_release(&a.self->start[b].value, e);
    return false;
  }

  FASTPAR_HD uint64_t deadline() const { return flags::deadline_after(Mem::now_ns(), p.timeout_ns); }

  FASTPAR_HD bool wait(int q, uint64_t deadline) const {
    const OwnStatusPoll<Mem> poll{&p};
    flags::OpDesc theirs{};
    flags::WaitStatus s = fused_wait_flag<Mem>(&a.peers[q]->start[b].value, e, deadline, poll);
    // The peer rewrites desc[e % 2] only at epoch e + 2, after our flag of e + 1.
    if (s == flags::WaitStatus::kOk && b == 0) {
      theirs = a.peers[q]->desc[e & 1u];
      if (!flags::same_call(mine(), theirs)) s = flags::WaitStatus::kMismatch;
    }
    if (s == flags::WaitStatus::kOk) return false;
    graph_failed<Mem>(a, record_failure<Mem>(p, s, q, &theirs));
    return true;
  }
};

// Block b's epoch for this call (read before the copy-in; only block b of
// this rank ever writes it, at the end of the call, graph_done).
FASTPAR_HD uint64_t graph_epoch(const GraphArgs& a, int b) { return a.self->epoch[b].value + 1; }
FASTPAR_HD void graph_done(const GraphArgs& a, int b, uint64_t e) { a.self->epoch[b].value = e; }

// The whole graphed call for block b: the earlier-failure check, the epoch,
// the copy-in to the epoch's graph slot, the barrier, the reduction. No second barrier: the next replay copies in
// to the other graph slot.
template <class Mem, typename T, ReduceOp OP, class Blk>
FASTPAR_HD void graph_block(const GraphArgs& a, int b, Blk& blk) {
  if (blk.leader([&] { return graph_prior_failure<Mem>(a, b) != 0; })) return;
  // The epoch is read where it is used rather than kept: only this block
  // writes it (graph_done, at the end), and a value live across the copy
  // and reduction loops costs them registers.
  blk.threads([&](int t, int nt) { fused_copy_in<T>(a.f, b, t, nt, graph_slot_offset(a, graph_epoch(a, b))); });
  if (blk.barrier(GraphPhase<Mem>{a.f.phase, a, b, graph_epoch(a, b)})) return;
  blk.threads([&](int t, int nt) { fused_reduce<T, OP, 1>(a.f, b, t, nt, graph_slot_offset(a, graph_epoch(a, b))); });
  blk.leader([&] {
    graph_done(a, b, graph_epoch(a, b));
    return false;
  });
}

// Enqueues the graphed kernel (ipc_fused_one_shot.cu): a.f.nblocks blocks.
cudaError_t launch_fused_graph(DType dt, ReduceOp op, const GraphArgs& a, cudaStream_t stream);

// Loads every fused and graphed kernel now (see cuda_kernels::preload_reduce_kernels).
cudaError_t preload_fused_kernels();


}  // namespace cuda_ipc
}  // namespace fastpar
