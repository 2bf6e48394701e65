// The protocol's phase step (flags::post, then flags::wait_and_check on every
// peer), written once over a memory-ordering policy: ipc_phase_kernel.cuh runs it
// as a one-thread kernel (DeviceMemory), and the host emulation
// (tests/cpp/cuda_host_emulation) runs the very same code over host atomics.
// Beyond flag_protocol.h's interface the policy has load_acquire_host (the
// host abort word), load_u32 and cas_u32 (the status word), store_release_u32
// (its host mirror and the replays' failure word), fetch_add (the graphed
// calls' count of finished blocks, ipc_graph.h), and load_relaxed (the
// kWaiterMemory form of the block barriers, below): device_memory_order.cuh.
#pragma once

#include <cstdint>

#include "../../transport/collective_call.h"  // kAuxWaiterFlags
#include "../../transport/flag_protocol.h"
#include "../../transport/cuda_ipc/ipc_arena.h"
#include "phase_launch.h"

namespace fastpar {
namespace cuda_ipc {

// Peer liveness is the host's business (it sees processes, see
// liveness/peer_watcher.h); on the device the way out of a wait besides the
// deadline and the peers' abort words is the host abort word: a word of
// host-mapped pinned memory that the host writes (a dead peer, abort()) and
// the waiting kernel polls every flags::kPollSpins spins. Why pinned host
// memory and not the control block's abort word in the arena: the arena is
// device memory, and a host write to it would need a copy on some stream,
// which would queue behind (or need a stream beside) the very kernel that is
// spinning; a mapped host word is read by the kernel directly over the bus,
// with ld.acquire.sys ordering it against the host's release store.
//
// The poll also reads every peer's abort word, not only the one of the peer
// being waited for: a survivor waiting on a dead rank would otherwise never
// hear that another survivor has already given up (each survivor's watcher
// finds the death too, but only where the dead pid is visible in its /proc).
template <class Mem>
struct PhasePoll {
  const PhaseArgs* a;
  FASTPAR_HD flags::WaitStatus operator()() const {
    if (a->host_abort != nullptr) {
      const uint64_t v = Mem::load_acquire_host(a->host_abort);
      if (v != 0) return flags::WaitStatus(int(v));
    }
    for (int q = 0; q < a->size; ++q)
      if (q != a->rank && Mem::load_acquire(&a->peers[q]->abort) != 0) return flags::WaitStatus::kPeerAborted;
    return flags::WaitStatus::kOk;
  }
};

// Records this rank's failure `s`: the status word that turns the rank's
// later kernels into no-ops, the mismatch record (a different call at `peer`,
// whose descriptor is `theirs`), the status word's host mirror (polled by the
// c10d backend's Work::wait without synchronizing), and the abort word, so
// peers waiting on us stop too: this is how one dead rank seen by one watcher
// reaches every survivor's kernels. Every kernel that waits records its
// failures here.
//
// The first failure wins (a compare-and-swap on the status word): in the
// fused kernels only block 0 compares descriptors, and the other blocks,
// waiting on flags a desynced peer never posts, give up on that peer's abort
// word. Were they to overwrite the status, the host would report "a peer
// aborted" instead of the mismatch, with a mirror that may disagree with the
// word. So only the winner writes the record and then the mirror (released
// after the record); losers raise the abort word only. Returns the status
// that stands. `mine`: this rank's descriptor of the failed phase where it is
// not a.desc (the fused two-shot's later phases), null otherwise.
// A fused kernel's wait for one block's flag to reach `seq`: spins, then
// asks `poll` (the host abort word, the peers' abort words, and whatever else
// the kernel must stop for) between rounds, until the deadline. `own`: the
// word is in this rank's memory, written there by the peer (FlagForm's
// kWaiterMemory): relaxed polls, then one acquire of the word, which orders
// the reads after the wait as an acquiring poll would (flags only grow, so it
// reads the phase too). Else a peer's word: every poll an acquire.
template <class Mem, class Poll>
FASTPAR_HD flags::WaitStatus fused_wait_flag(const uint64_t* word, uint64_t seq, uint64_t deadline, const Poll& poll,
                                             bool own = false) {
  for (;;) {
    FASTPAR_SPIN_LOOP
    for (int i = 0; i < flags::kPollSpins; ++i) {
      if ((own ? Mem::load_relaxed(word) : Mem::load_acquire(word)) >= seq) {
        if (own) Mem::load_acquire(word);
        return flags::WaitStatus::kOk;
      }
      Mem::pause();
    }
    // The host abort word and every peer's abort word. As wait_posted: a peer
    // may post its flag and then abort, so one more look at the flag after a
    // bad report tells a peer that went after posting from one that never did.
    const flags::WaitStatus s = poll();
    if (s != flags::WaitStatus::kOk) return Mem::load_acquire(word) >= seq ? flags::WaitStatus::kOk : s;
    if (Mem::now_ns() > deadline) return Mem::load_acquire(word) >= seq ? flags::WaitStatus::kOk : flags::WaitStatus::kTimeout;
  }
}

template <class Mem>
FASTPAR_HD uint32_t record_failure(const PhaseArgs& a, flags::WaitStatus s, int peer = -1,
                                   const flags::OpDesc* theirs = nullptr, const flags::OpDesc* mine = nullptr) {
  const uint32_t first = Mem::cas_u32(a.status, 0u, uint32_t(s));
  if (first == 0) {
    MismatchRecord* m = a.host_mismatch;
    if (s == flags::WaitStatus::kMismatch && m != nullptr && theirs != nullptr) {
      m->mine = mine != nullptr ? *mine : a.desc;
      m->theirs = *theirs;
      Mem::store_release_host(&m->peer_plus_one, uint64_t(peer) + 1);
    }
    if (a.host_status) Mem::store_release_u32(a.host_status, uint32_t(s));
  }
  flags::abort_rank<Mem>(a.self, uint64_t(s));
  return first != 0 ? first : uint32_t(s);
}

// Thread 0 of block b of a one-kernel call (the fused one-shot, two-shot and
// collectives), before anything else: the status word as this launch
// finds it (one read per block, shared: a kernel on another stream may set it
// mid-launch, and threads that saw different values would leave the block's
// __syncthreads() divergent). Non-zero: an earlier call failed here, the block
// writes nothing, and block 0 tells the peers.
template <class Mem>
FASTPAR_HD uint32_t fused_prior_failure(const PhaseArgs& p, int b) {
  const uint32_t s = Mem::load_u32(p.status);
  if (s != 0 && b == 0) flags::abort_rank<Mem>(p.self, s);
  return s;
}

// PhasePoll plus this rank's status word: once a block of this rank has
// failed (recorded), the others stop waiting too.
template <class Mem>
struct OwnStatusPoll {
  const PhaseArgs* a;
  FASTPAR_HD flags::WaitStatus operator()() const {
    const uint32_t own = Mem::load_u32(a->status);
    if (own != 0) return flags::WaitStatus(int(own));
    return PhasePoll<Mem>{a}();
  }
};

// A one-kernel call's barrier: block b posts its flag, then waits for block b
// of every peer. It is cut in two so that a block waits for its peers at
// once, one thread per peer (the block policy's barrier(): gpu_block.cuh, and
// the host emulation's HostBlock): with k ranks the last flag to arrive is
// then seen after one poll, not after up to k - 1 more remote loads. A
// phase object has
//   p            the call's PhaseArgs (size, rank);
//   arrive()     run by thread 0 after the block's writes of the phase (the
//                policy synchronizes the block first): the release of the
//                flag. True when this rank has already failed: nothing is
//                posted;
//   deadline()   when the wait of a thread gives up (taken before it);
//   notify(q)    run by thread t for peer q = barrier_peer(rank, size, t),
//                t = 1 .. size-1, at the same time as arrive(), before its
//                wait(q, d): kWaiterMemory's arrival in q's memory (nothing
//                in kPollPeer);
//   wait(q, d)   the acquire of peer q's flag, by thread t at the same time
//                as arrive() and the other waits. True
//                on a failure, already recorded (record_failure: the first
//                one of the rank stands, so waits that fail together do not
//                bury each other).
// The policy synchronizes the block again before the reads that the waits
// order. Every wait polls this rank's status word (OwnStatusPoll), so once one
// thread or block has failed, the others stop instead of waiting out the
// deadline.

// The peer that thread t (1 .. n-1) of a barrier waits for: each peer but
// this rank once, and thread 0 free to arrive.
FASTPAR_HD int barrier_peer(int rank, int n, int t) { return (rank + t) % n; }

// The two forms of a block's arrival and wait (FlagForm, ipc_arena.h). In
// kPollPeer, block b of each rank release-stores its own flag and the waiters
// acquire-poll it in that rank's memory. In kWaiterMemory the thread of block
// b that waits for peer q first writes this rank's arrival into q's inbox
// (Inbox::word[b][rank], a release store; block 0 its descriptor before it,
// Inbox::desc[rank][seq % 2], so the waiter compares descriptors on arrival,
// from its own memory), then polls its own inbox (fused_wait_flag's `own`):
// the waiting threads write to their peers at once, as they wait. Either way
// a word only grows (phase numbers, or the graphed calls' 2e + j) and waits
// test >=, so a form's words left from earlier calls, of this form or the
// other, never pass a wait. Thread 0's arrival is the same in both forms (its
// own flags): a peer in the other form (a misuse) then reaches its descriptor
// check and fails with kMismatch (the kWaiterMemory descriptors carry
// kAuxWaiterFlags) where it would wait for its deadline, and its abort word
// stops this rank's waits. The waits of both forms are one fused_wait_flag
// loop (every wait inlined into a kernel is a copy of the loop), and where
// the block compares descriptors the peer's is read after the wait: nothing
// of it is live in the loop, where these kernels have no register to spare.

// A call's descriptor as the block barriers of form `f` post it.
FASTPAR_HD flags::OpDesc marked_desc(flags::OpDesc d, FlagForm f) {
  if (f == FlagForm::kWaiterMemory && d.aux >= 0) d.aux |= kAuxWaiterFlags;
  return d;
}

// kWaiterMemory's arrival of block b of rank `rank` at `word` in peer q's
// inbox `in`, by the thread that waits for q, after the block's writes (the
// block policy synchronizes the block first): with `with_desc` (block 0 where
// its form compares descriptors) the descriptor `d` first, then the word,
// released. Nothing when this rank has already failed (the status word): its
// waits then stop on it. (`d` by reference and a flag, not a pointer that may
// be null: a local behind such a pointer stays in memory, a stack frame in
// every kernel.)
template <class Mem>
FASTPAR_HD void arrive_in_inbox(const PhaseArgs& p, Inbox* in, int b, uint64_t word, const flags::OpDesc& d,
                                bool with_desc) {
  if (Mem::load_u32(p.status) != 0) return;
  if (with_desc) in->desc[p.rank][flags::desc_of_phase(d.seq)] = d;
  Mem::store_release(&in->word[b][p.rank], word);
}

// The eager one-kernel calls' phase (ipc_fused_one_shot.h,
// ipc_fused_two_shot.h, ipc_fused_collectives.h): phase j of the call
// (desc.seq + j) on block b's flag (ipc_arena.h, block_flags_of), or in
// kWaiterMemory the inboxes (inbox_of). Block 0 also posts the control
// block's flag with the descriptor and checks every peer's
// (flags::wait_and_check, or the descriptor in its inbox), so the descriptor
// check of every phase stays; other blocks wait on their flag only.
template <class Mem>
struct BlockPhase {
  const PhaseArgs& p;
  FlagLine* self_blocks;
  const FlagLine* const* peer_blocks;
  int b;
  flags::OpDesc mine;  // the call's descriptor at this phase (marked_desc)

  FASTPAR_HD bool arrive() const {
    // Another block of this rank failed: stop before posting a phase whose
    // data that block never wrote.
    if (Mem::load_u32(p.status) != 0) return true;
    Mem::store_release(&self_blocks[b].value, mine.seq);
    if (b == 0) flags::post<Mem>(p.self, mine);
    return false;
  }

  FASTPAR_HD uint64_t deadline() const { return flags::deadline_after(Mem::now_ns(), p.timeout_ns); }

  // kWaiterMemory: this rank's arrival in peer q's inbox (arrive_in_inbox).
  FASTPAR_HD void notify(int q) const {
    if (p.flag_form == FlagForm::kWaiterMemory) arrive_in_inbox<Mem>(p, inbox_of(p.peers[q]), b, mine.seq, mine, b == 0);
  }

  FASTPAR_HD bool wait(int q, uint64_t deadline) const {
    const OwnStatusPoll<Mem> poll{&p};
    flags::OpDesc theirs{};
    const bool waiter = p.flag_form == FlagForm::kWaiterMemory;
    flags::WaitStatus s =
        b == 0 && !waiter
            ? flags::wait_and_check<Mem>(p.peers[q], mine, deadline, poll, &theirs)
            : fused_wait_flag<Mem>(waiter ? &inbox_of(p.self)->word[b][q] : &peer_blocks[q][b].value, mine.seq,
                                   deadline, poll, waiter);
    if (s == flags::WaitStatus::kOk && waiter && b == 0) {
      theirs = inbox_of(p.self)->desc[q][flags::desc_of_phase(mine.seq)];
      if (!flags::same_call(mine, theirs)) s = flags::WaitStatus::kMismatch;
    }
    if (s == flags::WaitStatus::kOk) return false;
    record_failure<Mem>(p, s, q, &theirs, &mine);
    return true;
  }
};

template <class Mem>
FASTPAR_HD BlockPhase<Mem> block_phase(const PhaseArgs& p, FlagLine* self_blocks, const FlagLine* const* peer_blocks,
                                       int b, int64_t j) {
  flags::OpDesc mine = marked_desc(p.desc, p.flag_form);
  mine.seq = p.desc.seq + uint64_t(j);
  return BlockPhase<Mem>{p, self_blocks, peer_blocks, b, mine};
}

template <class Mem>
FASTPAR_HD void phase_step(const PhaseArgs& a) {
  const uint32_t failed = Mem::load_u32(a.status);
  if (failed != 0) {
    // An earlier phase failed here: tell the peers instead of posting a phase
    // whose data this rank never wrote.
    flags::abort_rank<Mem>(a.self, failed);
    return;
  }
  flags::post<Mem>(a.self, a.desc);
  const uint64_t deadline = flags::deadline_after(Mem::now_ns(), a.timeout_ns);
  const PhasePoll<Mem> poll{&a};
  for (int q = 0; q < a.size; ++q) {
    if (q == a.rank) continue;
    flags::OpDesc theirs;
    const flags::WaitStatus s = flags::wait_and_check<Mem>(a.peers[q], a.desc, deadline, poll, &theirs);
    if (s != flags::WaitStatus::kOk) {
      record_failure<Mem>(a, s, q, &theirs);
      return;
    }
  }
}

}  // namespace cuda_ipc
}  // namespace fastpar
