// The all_reduce a CUDA graph can capture: the fused one-shot
// (ipc_fused_one_shot.h, graph_block) and the fused two-shot
// (ipc_fused_two_shot.h, graph_two_shot_block) in forms whose replays repeat
// nothing a host counter gave them. A replay of a call of some size runs the
// schedule and the grid the eager call of that size runs (allreduce_graphed,
// ipc_allreduce.cpp): the one-shot with fused_blocks' grid up to the one-shot
// limit, the two-shot with two_shot_blocks' above it, up to one slot.
//
// A captured kernel replays with the arguments it had at capture, so its
// phase numbers and slots cannot come from the host's counters as the eager
// kernels' do. These kernels keep their state in the arena's graph region
// (ipc_arena.h: GraphControl and two graph slots):
//   * the epoch: the graphed calls this rank has completed. Every block reads
//     it at its start and works on epoch + 1 = e, so every replay is a new
//     call; the last block of the grid to finish (graph_finish: a count of
//     finished blocks) advances it, after every block has read it, and the
//     next graphed kernel on the stream starts after this one ended. One word
//     for the rank, not one per block, because grids differ by size: a block
//     that a small call does not run must not fall behind;
//   * block b's barrier flag: phase j of epoch e posts 2e + j (the one-shot
//     has phase 0, the two-shot phases 0 and 1), so the flags only grow,
//     whichever grid posted them last, and a wait for >= 2e + j never passes
//     on an earlier call's post;
//   * epoch e copies in to graph slot e % 2, so a call needs no barrier after
//     its last reads: this rank's call e + 2, the next to write that slot,
//     starts after its call e + 1 ended, and every block of e + 1 waited for
//     a block of every peer's e + 1, which a peer's kernel posts only after
//     its kernel e, every read of the slot included, ended;
//   * block 0 writes the call's descriptor (seq = e) in desc[e % 2] before its
//     first flag and compares every peer's after acquiring theirs: a desynced
//     graphed call fails with kMismatch (the one-shot and the two-shot have
//     aux values of their own, so ranks whose one-shot limits differ fail
//     too). A peer rewrites desc[e % 2] only at e + 2, after its flags of
//     e + 1, which need ours, posted after this comparison.
// Graphed and eager calls have separate flags and slots, but on a rank's
// stream they run in the order enqueued, so that combined order must be the
// same on every rank. Rank 0 replaying G then calling E while rank 1 calls
// E then replays G is a deadlock (each waits for flags the other posts only
// after its own wait): both fail at the timeout, or as soon as one gives up
// (the abort words); nothing is reduced from unposted data. And replays must not
// run at once (two graphs holding these calls replayed on two streams, or
// on parallel branches of one graph): they would share the epoch and the
// graph slots, overwrite each other's copy-in, and with equal
// descriptors (same size, dtype and op) nothing notices the wrong results.
//
// Failures are recorded as in the eager kernels (status word, host mirror,
// abort word). A replay never calls into the host backend, so it cannot
// raise; and a trap would end the process's CUDA context (under MPS, every
// client's on the GPU). So a replay that fails, or that finds an earlier
// failure, also sets the failure word (IpcComm::host_replay_failure,
// graph_failed) and returns without writing: the host's next call on this
// communicator raises, naming the replay (ipc_failure.h). Every wait polls
// the host abort word, so the peer watcher stops a replay waiting on a dead
// peer.
#pragma once

#include <cstdint>

#include "../../transport/cuda_ipc/ipc_arena.h"
#include "../../transport/flag_protocol.h"
#include "phase_step.h"

namespace fastpar {
namespace cuda_ipc {

// What every graphed kernel has besides its schedule's arguments.
struct GraphRegion {
  int64_t parity_stride;  // bytes from graph slot 0 to graph slot 1
  GraphControl* self;
  GraphControl* peers[kMaxIpcRanks];  // read, but for the kWaiterMemory form's inboxes
  uint32_t* replay_failure;  // IpcComm::host_replay_failure, or null
};

// Bytes from graph slot 0 to the slot of epoch e.
FASTPAR_HD int64_t graph_slot_offset(const GraphRegion& g, uint64_t e) { return int64_t(e & 1u) * g.parity_stride; }

// A replay that failed (`status`, recorded) or found the status word
// already set: the failure word takes the status, for the host.
template <class Mem>
FASTPAR_HD void graph_failed(const GraphRegion& g, uint32_t status) {
  if (g.replay_failure != nullptr && status != 0) Mem::store_release_u32(g.replay_failure, status);
}

// fused_prior_failure for the graphed kernels: block 0 also sets the failure
// word; every block returns without writing.
template <class Mem>
FASTPAR_HD uint32_t graph_prior_failure(const PhaseArgs& p, const GraphRegion& g, int b) {
  const uint32_t s = fused_prior_failure<Mem>(p, b);
  if (s != 0 && b == 0) graph_failed<Mem>(g, s);
  return s;
}

// This call's epoch (read where it is used rather than kept: a value live
// across the copy and reduction loops costs them registers; only the last
// block to finish writes it, graph_finish).
FASTPAR_HD uint64_t graph_epoch(const GraphRegion& g) { return g.self->epoch.value + 1; }

// Block b's phase j (0 or 1) of epoch e (a phase object, phase_step.h):
// arrive (at phase 0, block 0 first writes the call's descriptor, seq = e,
// in desc[e % 2], published by the release), and the wait for peer q, which
// block 0 follows at phase 0 with the comparison of q's descriptor. A failure
// is recorded, the failure word included (graph_failed). In the
// kWaiterMemory form (p.flag_form) the arrival and block 0's descriptor go
// into every peer's GraphControl::inbox as well (notify; the descriptor by
// parity, rewritten at e + 2 as desc[e % 2] is), and the waits poll this
// rank's.
template <class Mem>
struct GraphPhase {
  const PhaseArgs& p;
  const GraphRegion& g;
  int b;
  uint64_t e;
  int j;

  FASTPAR_HD flags::OpDesc mine() const {
    flags::OpDesc d = marked_desc(p.desc, p.flag_form);
    d.seq = e;
    return d;
  }
  FASTPAR_HD uint64_t flag() const { return 2 * e + uint64_t(j); }

  FASTPAR_HD bool arrive() const {
    // Another block of this rank failed: stop before posting a phase whose
    // data that block never wrote.
    const uint32_t own = Mem::load_u32(p.status);
    if (own != 0) {
      graph_failed<Mem>(g, own);
      return true;
    }
    if (b == 0 && j == 0) g.self->desc[e & 1u] = mine();
    Mem::store_release(&g.self->start[b].value, flag());
    return false;
  }

  FASTPAR_HD uint64_t deadline() const { return flags::deadline_after(Mem::now_ns(), p.timeout_ns); }

  // kWaiterMemory: this rank's arrival in peer q's inbox (phase_step.h, arrive_in_inbox).
  FASTPAR_HD void notify(int q) const {
    if (p.flag_form == FlagForm::kWaiterMemory)
      arrive_in_inbox<Mem>(p, &g.peers[q]->inbox, b, flag(), mine(), b == 0 && j == 0);
  }

  FASTPAR_HD bool wait(int q, uint64_t deadline) const {
    const OwnStatusPoll<Mem> poll{&p};
    flags::OpDesc theirs{};
    const bool waiter = p.flag_form == FlagForm::kWaiterMemory;
    flags::WaitStatus s = fused_wait_flag<Mem>(waiter ? &g.self->inbox.word[b][q] : &g.peers[q]->start[b].value,
                                               flag(), deadline, poll, waiter);
    // The peer rewrites desc[e % 2] (and its entry in this rank's inbox)
    // only at epoch e + 2, after its flags of e + 1.
    if (s == flags::WaitStatus::kOk && b == 0 && j == 0) {
      theirs = waiter ? g.self->inbox.desc[q][e & 1u] : g.peers[q]->desc[e & 1u];
      if (!flags::same_call(mine(), theirs)) s = flags::WaitStatus::kMismatch;
    }
    if (s == flags::WaitStatus::kOk) return false;
    const flags::OpDesc me = mine();
    graph_failed<Mem>(g, record_failure<Mem>(p, s, q, &theirs, &me));
    return true;
  }
};

// The end of block b of a graphed call of `nblocks` blocks, whether it
// succeeded or not (on thread 0, after the block's reads of the epoch: the
// block policy's leader() synchronizes the block first): counts the block
// finished, and the last of the grid advances the epoch and resets the count
// (acquire-release: every other block's reads of the epoch happen before).
template <class Mem>
FASTPAR_HD void graph_finish(const GraphRegion& g, int nblocks) {
  if (Mem::fetch_add(&g.self->arrived.value, 1) + 1 != uint64_t(nblocks)) return;
  g.self->arrived.value = 0;
  g.self->epoch.value += 1;
}

}  // namespace cuda_ipc
}  // namespace fastpar
