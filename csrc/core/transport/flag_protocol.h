// The cross-rank flag protocol, written once for every multi-process transport:
// the CPU shared-memory path (processes on one host, POSIX shm) and the CUDA IPC
// path (one GPU per process, peer-mapped memory) run this same code over a
// different memory-ordering policy.
//
// Model. Each rank owns a control block that every peer can read (mapped shm,
// or IPC-mapped device memory) and that only its owner writes. A collective is a
// sequence of *phases*; phase numbers (`seq`) are global to a communicator and
// increase by one per phase on every rank. In a phase a rank
//   1. writes the data it publishes into its own slot,
//   2. writes a descriptor (op, count, dtype, root, seq) for this phase,
//   3. posts: store-release `flag = seq`,
//   4. waits: load-acquire every peer's flag until it is >= seq, then checks
//      the peer's descriptor against its own,
//   5. reads peers' slots.
// Release (3) / acquire (4) order the data and descriptor writes of (1)-(2)
// before the peer's reads in (4)-(5): that is the only ordering argument.
//
// Why a peer's flag is never more than one phase ahead: to pass phase p+1 a rank
// needs every flag >= p+1, including ours, which we post only after finishing
// our reads of phase p. Hence after step 4 of phase p all peers are at p or p+1,
// and every peer has finished reading phase p-1.
//
// Rotating buffers. Data slots rotate over kSlots = 3 by *round* (a round is
// the data one chunk publishes). The rule every schedule keeps: a rank rewrites
// a slot only after waiting for a phase that every peer posts after its last
// read of that slot. One-phase rounds (publish, post p, peers read before
// posting p+1) need 2 slots; the pipelined two-shot allreduce, whose chunk k is
// read until the phase after the one that published it (its reduced shards are
// copied out one phase later, while chunk k+1 is reduced), needs 3: chunk k+3
// reuses chunk k's slot after the wait of phase P(k+2), which every peer posts
// after copying chunk k out. Descriptors rotate over 2 by phase (a reader checks
// desc[p % 2] after seeing flag >= p; the writer can only be at p or p+1, and
// p+1 writes the other descriptor).
//
// Waiting never hangs: every wait has a deadline and returns a status. The policy
// also gets a `poll` callback every kPollSpins spins; the host uses it to look
// at peers' abort words and liveness and to yield when ranks outnumber cores.
//
// Memory-ordering policy (the whole interface a transport supplies):
//   static uint64_t load_acquire(const uint64_t* p);  // host: __atomic ACQUIRE;
//                                                     // device: ld.acquire.sys.u64
//   static void store_release(uint64_t* p, uint64_t v); // host: __atomic RELEASE;
//                                                       // device: st.release.sys.u64
//   static void pause();            // host: the x86 PAUSE hint; device: __nanosleep
//   static uint64_t now_ns();       // a monotonic clock: steady_clock / %globaltimer
#pragma once

#include <cstdint>

#include "../kernels/half_types.h"  // FASTPAR_HD

// The spin loops below (and the kernels' own) stay loops on the device:
// nvcc unrolls a constant kPollSpins trip count, copying every wait that is
// inlined into a kernel many times over for no gain in how soon it sees the
// flag.
#if defined(__CUDA_ARCH__)
#define FASTPAR_SPIN_LOOP _Pragma("unroll 1")
#else
#define FASTPAR_SPIN_LOOP
#endif

namespace fastpar {
namespace flags {

constexpr int kSlots = 3;        // rotating data buffers per rank
constexpr int kDescSlots = 2;    // rotating descriptors per rank
constexpr int kPollSpins = 256;  // spins between deadline / poll checks (cheap, and short against any deadline)

enum class WaitStatus : int { kOk = 0, kTimeout = 1, kPeerAborted = 2, kPeerDead = 3, kMismatch = 4 };

// What a rank says it is doing in one phase; peers compare it with their own
// call so that ranks that diverge (different op, size, dtype, root) fail with a
// message instead of reading garbage. 40 bytes: one cache line with the flag.
struct OpDesc {
  uint64_t seq;      // the phase number
  int64_t count;     // elements per rank (op-specific meaning; -1: not compared)
  int64_t aux;       // op-specific (registered-buffer offset, ...; -1: not compared)
  int32_t op;        // collective id (transport's enum)
  int32_t dtype;     // DType
  int32_t root;      // root rank, -1 when none
  int32_t redop;     // ReduceOp or -1
};

FASTPAR_HD bool same_call(const OpDesc& a, const OpDesc& b) {
  return a.seq == b.seq && a.op == b.op && a.dtype == b.dtype && a.root == b.root &&
         a.redop == b.redop && (a.count < 0 || b.count < 0 || a.count == b.count) &&
         (a.aux < 0 || b.aux < 0 || a.aux == b.aux);
}

// One rank's control block. Cache-line separated so that a rank spinning on a
// peer's flag does not bounce the line its own writes go to.
struct alignas(64) ControlBlock {
  uint64_t flag;           // last posted phase (0: none yet)
  uint64_t pad0[7];
  uint64_t abort;          // non-zero once this rank has failed: peers stop waiting
  uint64_t pad1[7];
  OpDesc desc[kDescSlots];  // desc[seq % 2] describes phase seq
};

FASTPAR_HD int slot_of_round(uint64_t round) { return int(round % kSlots); }
FASTPAR_HD int desc_of_phase(uint64_t seq) { return int(seq % kDescSlots); }

// `timeout_ns` after `now_ns`, saturating: the GPU's clock (%globaltimer)
// counts from the Unix epoch, so a timeout of centuries (timedelta.max) would
// wrap to a deadline in the past and fail every wait at once.
FASTPAR_HD uint64_t deadline_after(uint64_t now_ns, uint64_t timeout_ns) {
  return timeout_ns > ~uint64_t(0) - now_ns ? ~uint64_t(0) : now_ns + timeout_ns;
}

// Post phase `seq` with descriptor `d` (d.seq must equal seq): publishes every
// write this rank made before the call.
template <class Mem>
FASTPAR_HD void post(ControlBlock* self, const OpDesc& d) {
  self->desc[desc_of_phase(d.seq)] = d;
  Mem::store_release(&self->flag, d.seq);
}

// Mark this rank failed so peers waiting on it return kPeerAborted promptly.
template <class Mem>
FASTPAR_HD void abort_rank(ControlBlock* self, uint64_t code) {
  Mem::store_release(&self->abort, code == 0 ? 1 : code);
}

// Spin until `peer` has posted phase >= seq. `poll()` (every kPollSpins spins)
// returns kOk to go on waiting or a status to give up with; the deadline is an
// absolute Mem::now_ns() value.
template <class Mem, class Poll>
FASTPAR_HD WaitStatus wait_posted(const ControlBlock* peer, uint64_t seq, uint64_t deadline_ns,
                                  Poll&& poll) {
  for (;;) {
    FASTPAR_SPIN_LOOP
    for (int i = 0; i < kPollSpins; ++i) {
      if (Mem::load_acquire(&peer->flag) >= seq) return WaitStatus::kOk;
      Mem::pause();
    }
    // A peer may post its last phase and then abort, leave or exit: poll()
    // reads that state with acquire, so one more look at the flag after a bad
    // report tells a peer that went after posting from one that never did.
    WaitStatus s = Mem::load_acquire(&peer->abort) != 0 ? WaitStatus::kPeerAborted : poll();
    if (s != WaitStatus::kOk) return Mem::load_acquire(&peer->flag) >= seq ? WaitStatus::kOk : s;
    if (Mem::now_ns() > deadline_ns) {
      // One last look: the flag may have landed while we checked the clock.
      return Mem::load_acquire(&peer->flag) >= seq ? WaitStatus::kOk : WaitStatus::kTimeout;
    }
  }
}

// Wait for peer's phase `mine.seq` and compare its descriptor with ours.
template <class Mem, class Poll>
FASTPAR_HD WaitStatus wait_and_check(const ControlBlock* peer, const OpDesc& mine,
                                     uint64_t deadline_ns, Poll&& poll, OpDesc* theirs) {
  const WaitStatus s = wait_posted<Mem>(peer, mine.seq, deadline_ns, poll);
  if (s != WaitStatus::kOk) return s;
  *theirs = peer->desc[desc_of_phase(mine.seq)];
  return same_call(mine, *theirs) ? WaitStatus::kOk : WaitStatus::kMismatch;
}

}  // namespace flags
}  // namespace fastpar
