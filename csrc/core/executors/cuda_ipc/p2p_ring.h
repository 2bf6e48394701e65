// Point-to-point over CUDA IPC: the ring layout and the four steps of its
// protocol, written once over a memory-ordering policy (like phase_step.h):
// ipc_p2p_kernel.cu runs each step as a one-thread kernel (DeviceMemory), the host
// emulation (tests/cpp/cuda_host_emulation/ipc_p2p_test.cpp) runs the same
// code over host atomics.
//
// The shape is the CPU path's (cpu_shm/shm_p2p.h): every ordered pair
// (s -> d) has one single-producer / single-consumer ring of kP2PChunks
// chunks of kP2PChunkBytes in the SENDER's arena (the p2p region after the
// collective slots, ipc_arena.h). Chunk number i (1-based, per pair) lives in
// ring slot (i - 1) % kP2PChunks. Two counters, one writer each:
//   posted[d]    in the sender's P2PControl: chunks it has published to d
//   consumed[s]  in the receiver's P2PControl: chunks it has read from s
// Sender, per chunk i (one stream):
//   credit  wait until the receiver's consumed[s] >= i - kP2PChunks
//           (the ring slot is free again), acquire
//   copy    the status-guarded copy kernel, caller's bytes -> ring slot
//   post    write the chunk header {i, tag, total, offset}, release posted[d] = i
// Receiver, per chunk i (one stream):
//   wait    acquire posted[s] >= i; the header must say this call's tag,
//           total and offset, else kMismatch
//   copy    the guarded copy kernel, ring slot -> caller's bytes
//   consume release consumed[s] = i
// Between the steps stream order carries the data: a copy kernel completes
// before the next kernel of the stream starts, and the post/consume kernel's
// system-scope release publishes it to the peer's acquire (the same argument
// as the collectives' phase kernel).
//
// Matching: in order per pair. Chunk numbers are counted on the host at
// enqueue time, so the i-th message a rank posts to d is taken by the i-th
// receive d posts from it; the header lets the receiver check the sender's
// tag and size and fail with kMismatch (never read garbage) when the two
// programs disagree. MPI's out-of-order matching by tag (and any-source
// receives) would need the receiver to learn which message arrived before it
// enqueues the copy: a device-to-host round trip per message, which the
// stream-ordered design has no place for.
//
// Failures as the phase kernel's: a deadline, a peer's abort word or the host
// abort word (a dead peer, abort()) record the status in this rank's status
// word (and its host mirror), abort this rank's control block so that peers'
// waits end, and every later step and copy of this rank does nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "../../transport/flag_protocol.h"
#include "../../transport/cuda_ipc/ipc_arena.h"

namespace fastpar {
namespace cuda_ipc {

enum class P2PStep : int32_t { kCredit = 0, kPost = 1, kWait = 2, kConsume = 3 };

struct P2PArgs {
  P2PStep step;
  P2PControl* self;             // this rank's p2p control
  P2PControl* peer;             // the other end's (read only)
  flags::ControlBlock* self_cb; // this rank's control block (its abort word)
  const flags::ControlBlock* peers_cb[kMaxIpcRanks];  // every rank's, for their abort words
  uint32_t* status;             // this rank's status word
  uint32_t* host_status;        // its host mirror, or null
  const uint64_t* host_abort;   // host abort word (device view), or null
  int rank;
  int other;                    // destination (send) or source (recv)
  int size;
  uint64_t seq;                 // chunk number, 1-based, per pair and direction
  int64_t tag;
  int64_t total;
  int64_t offset;
  uint64_t timeout_ns;
};

template <class Mem>
FASTPAR_HD void p2p_fail(const P2PArgs& a, flags::WaitStatus s) {
  // The first failure stands, as in record_failure (phase_step.h): a send
  // and a receive on two streams may fail at once, and the host reports the
  // status word's cause.
  if (Mem::cas_u32(a.status, 0u, uint32_t(s)) == 0 && a.host_status)
    Mem::store_release_u32(a.host_status, uint32_t(s));
  flags::abort_rank<Mem>(a.self_cb, uint64_t(s));
}

// Spin until *word >= target, polling every rank's abort word and the host
// abort word every kPollSpins spins (the phase kernel's PhasePoll rule).
template <class Mem>
FASTPAR_HD flags::WaitStatus p2p_wait_for(const P2PArgs& a, const uint64_t* word, uint64_t target) {
  const uint64_t deadline = flags::deadline_after(Mem::now_ns(), a.timeout_ns);
  for (;;) {
    FASTPAR_SPIN_LOOP
    for (int i = 0; i < flags::kPollSpins; ++i) {
      if (Mem::load_acquire(word) >= target) return flags::WaitStatus::kOk;
      Mem::pause();
    }
    if (a.host_abort != nullptr) {
      const uint64_t v = Mem::load_acquire_host(a.host_abort);
      if (v != 0) return flags::WaitStatus(int(v));
    }
    for (int q = 0; q < a.size; ++q)
      if (q != a.rank && Mem::load_acquire(&a.peers_cb[q]->abort) != 0) return flags::WaitStatus::kPeerAborted;
    if (Mem::now_ns() > deadline)
      return Mem::load_acquire(word) >= target ? flags::WaitStatus::kOk : flags::WaitStatus::kTimeout;
  }
}

// Whether the header of chunk a.seq says what this receive expects.
FASTPAR_HD bool p2p_header_matches(const P2PHeader& h, const P2PArgs& a) {
  return h.seq == a.seq && h.tag == a.tag && h.total == a.total && h.offset == a.offset;
}

template <class Mem>
FASTPAR_HD void p2p_step(const P2PArgs& a) {
  if (Mem::load_u32(a.status) != 0) {
    // An earlier step failed here: peers stop waiting for this rank.
    flags::abort_rank<Mem>(a.self_cb, Mem::load_u32(a.status));
    return;
  }
  switch (a.step) {
    case P2PStep::kCredit: {
      if (a.seq <= uint64_t(kP2PChunks)) return;  // the ring slot was never used
      const flags::WaitStatus s = p2p_wait_for<Mem>(a, &a.peer->consumed[a.rank].value, a.seq - kP2PChunks);
      if (s != flags::WaitStatus::kOk) p2p_fail<Mem>(a, s);
      return;
    }
    case P2PStep::kPost: {
      P2PHeader& h = a.self->hdr[a.other][(a.seq - 1) % kP2PChunks];
      h.seq = a.seq;
      h.tag = a.tag;
      h.total = a.total;
      h.offset = a.offset;
      Mem::store_release(&a.self->posted[a.other].value, a.seq);
      return;
    }
    case P2PStep::kWait: {
      const flags::WaitStatus s = p2p_wait_for<Mem>(a, &a.peer->posted[a.rank].value, a.seq);
      if (s != flags::WaitStatus::kOk) {
        p2p_fail<Mem>(a, s);
        return;
      }
      const P2PHeader h = a.peer->hdr[a.rank][(a.seq - 1) % kP2PChunks];
      if (!p2p_header_matches(h, a)) p2p_fail<Mem>(a, flags::WaitStatus::kMismatch);
      return;
    }
    case P2PStep::kConsume:
      Mem::store_release(&a.self->consumed[a.other].value, a.seq);
      return;
  }
}

// Enqueues p2p_step(a) as a one-thread kernel on `stream` (ipc_p2p_kernel.cu).
cudaError_t launch_p2p_step(const P2PArgs& a, cudaStream_t stream);
// Loads the p2p step kernel now (see cuda_kernels::preload_reduce_kernels).
cudaError_t preload_p2p_kernel();

}  // namespace cuda_ipc
}  // namespace fastpar
