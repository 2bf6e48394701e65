// What every schedule in allreduce_slots.h, reduce_slots.h and
// copy_collectives_slots.h is written against: a multi-process "slot
// transport". Each rank owns flags::kSlots rotating slots that every peer can
// read, and the phases of the flag protocol (flag_protocol.h) order the writes
// into them before the peers' reads. Two transports run the very same
// schedules:
//   cpu_shm::ShmComm     processes on one host, POSIX shared memory; every
//                        step runs on the calling thread
//   cuda_ipc::IpcSteps   one GPU per process (or one GPU shared), IPC-mapped
//                        device memory; every step is enqueued on one stream
//                        and nothing blocks the host
// so a collective has one shape, one descriptor and one set of desync checks
// whichever memory it moves.
//
// The Comm interface:
//   int rank(), size();  int64_t slot_bytes();
//   char* slot(int q, int k)     slot k of rank q, as mapped in this process
//   int next_round()             the slot of the next round (flag_protocol.h)
//   void phase(const CollCall&)  post this rank's flag with the call's
//                                descriptor, wait for every peer's, compare
//   void publish(char* dst, const void* src, int64_t bytes)
//                                write into this rank's own slot
//   void copy(void* dst, const void* src, int64_t bytes)
//                                write the caller's output (from a peer's slot
//                                or from the caller's input); on the GPU this
//                                step does nothing once a phase has failed, so
//                                no output is written from a slot a peer never
//                                filled
//   char* arena(int q)           rank q's registered buffers (only
//                                allreduce_registered uses it)
// Reductions also take a Reducer, the transport's element math for the call's
// dtype and op:
//   reduce(const void* const* srcs, int nsrc, void* const* dsts, int ndst, int64_t count)
//     every dsts[i][0, count) = op over srcs[0 .. nsrc) in that order, with nsrc
//     contributions (AVG divides by nsrc). Sources are always in rank order,
//     so every rank that reduces an element produces the same bits.
// Failures: ShmComm::phase throws (a timeout, a dead or aborted peer, a
// desynced call); IpcSteps throws only when a step cannot be enqueued, a
// failed wait on the GPU is recorded in the status word instead.
#pragma once

#include <algorithm>
#include <cstdint>

namespace fastpar {

// How many pieces of `piece` bytes (or elements) `total` takes: at least one,
// so that every call runs at least one phase and even a zero-size call meets
// its peers and has its descriptor checked.
inline int64_t num_pieces(int64_t total, int64_t piece) { return std::max<int64_t>(1, (total + piece - 1) / piece); }

// Length of piece i (0 past the end).
inline int64_t piece_len(int64_t i, int64_t piece, int64_t total) {
  return std::max<int64_t>(0, std::min(piece, total - i * piece));
}

// A slot cut into n regions, one per destination rank (scatter, all-to-all,
// reduce-scatter): 16-byte multiples, so that every region keeps the vector
// alignment of the slot, wherever the slot is large enough. Slots are at least
// 64 bytes and n at most 8 on the GPU (at least 1 KiB and n <= 64 on the CPU),
// so a region always holds an element of the widest dtype (8 bytes).
inline int64_t region_bytes(int64_t slot_bytes, int n) {
  const int64_t r = slot_bytes / n;
  return r >= 16 ? r / 16 * 16 : r;
}

// Allreduce shards start on 64-byte boundaries: no two ranks write one cache
// line, and every shard keeps the 16-byte alignment of its buffer.
inline int64_t shard_align(int64_t elem_bytes) { return std::max<int64_t>(1, 64 / elem_bytes); }

}  // namespace fastpar
