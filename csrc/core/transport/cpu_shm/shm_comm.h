// The CPU shared-memory transport: n processes on one host, one segment each,
// every segment mapped by every rank. The schedules in algorithms/*_slots.h
// drive it through the slot-transport interface (core/algorithms/slot_transport.h:
// rank(), size(), slot(), next_round(), phase(), publish(), copy(); arena()
// for registered buffers); it knows nothing about which collective runs or in
// what order chunks move.
//
// Segment layout (per rank, identical sizes on every rank):
//   [0, 4 KiB)                   SegmentHeader + flags::ControlBlock
//   [4 KiB, +3 * slot_bytes)     the rotating data slots (flags::kSlots)
//   [.., +arena_bytes)           registered buffers (registered_empty)
//   [.., +size * p2p block)      point-to-point channels, one block per peer
//                                (shm_p2p.h; block q: this rank -> q)
//
// Memory. The segment is a sparse tmpfs file: what is never touched costs
// nothing, but a page touched when /dev/shm is full kills the process with
// SIGBUS. So every page this rank will touch is reserved (fallocate) before it
// is used, where a full /dev/shm is an error that says what to lower: the
// header, the slots and the channels to peers when the communicator is built
// (fixed_shm_bytes), a registered buffer's pages when registered_empty hands
// it out (and given back when it is freed). The registered region is only
// address space until then.
#pragma once

#include <atomic>
#include <chrono>
#include <cstring>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "../collective_call.h"
#include "../flag_protocol.h"
#include "../registered_arena.h"
#include "shm_segment.h"

namespace fastpar {
namespace cpu_shm {

// How ranks find each other: key/value calls on a shared store (a c10d::Store
// in the extension). `get` is called only for keys `check` has seen; `check`
// never blocks, so init can watch its peers' liveness while it waits.
struct Rendezvous {
  std::function<void(const std::string& key, const std::string& value)> set;
  std::function<std::string(const std::string& key)> get;
  std::function<bool(const std::string& key)> check;
};

struct ShmOptions {
  int64_t slot_bytes;   // one rotating data slot; the chunk unit of every schedule
  int64_t arena_bytes;  // registered-buffer arena
  int64_t p2p_chunk_bytes;  // one chunk of a point-to-point channel (kP2PChunks per channel)
  std::chrono::milliseconds timeout;
};

// Chunks in the ring of one point-to-point channel: enough that a sender
// streaming a large message rarely waits for its receiver to free one.
constexpr int kP2PChunks = 4;

// The measured defaults (shm_comm.cpp). The torch layer overrides them from
// FASTPAR_SHM_SLOT_BYTES / _REGISTERED_BYTES / _P2P_CHUNK_BYTES
// (torch/distributed/knobs.h; tests shrink slots and chunks so small tensors
// cross many of them).
ShmOptions default_shm_options(std::chrono::milliseconds timeout);

// The /dev/shm memory one rank of a `size`-rank communicator reserves when it
// is built: header, slots, one channel to each peer (3 MiB + 1 MiB per peer with
// the defaults: 8 MiB in all for 2 ranks, 24 MiB for 4).
int64_t fixed_shm_bytes(const ShmOptions& o, int size);

class ShmComm {
 public:
  // rank/size within this communicator; `global_ranks[i]` is the torch rank of
  // local rank i (used in messages only).
  ShmComm(int rank, int size, std::vector<int> global_ranks, const Rendezvous& rv, ShmOptions opts);
  ~ShmComm();
  ShmComm(const ShmComm&) = delete;
  ShmComm& operator=(const ShmComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int global_rank(int r) const { return global_ranks_[r]; }
  int64_t slot_bytes() const { return opts_.slot_bytes; }
  int64_t arena_bytes() const { return opts_.arena_bytes; }
  std::chrono::milliseconds timeout() const { return opts_.timeout; }
  // The timeout the next collectives use (a per-call override from torch).
  void set_timeout(std::chrono::milliseconds t) { opts_.timeout = t; }

  char* slot(int peer, int k) const { return base_[peer] + kHeaderBytes + int64_t(k) * opts_.slot_bytes; }
  char* arena(int peer) const { return base_[peer] + kHeaderBytes + flags::kSlots * opts_.slot_bytes; }
  // The point-to-point block in `owner`'s segment for channel owner -> peer
  // (layout in shm_p2p.cpp); p2p_block_bytes() apart.
  char* p2p_block(int owner, int peer) const { return arena(owner) + opts_.arena_bytes + int64_t(peer) * p2p_block_bytes(); }
  int64_t p2p_block_bytes() const;
  int64_t p2p_chunk_bytes() const { return opts_.p2p_chunk_bytes; }

  // Starts a collective: checks the communicator is usable, fixes the deadline
  // (now + timeout) that every phase of this call waits against.
  void begin(Coll op, std::chrono::milliseconds timeout);
  // The next rotating-buffer round (see flag_protocol.h); returns its slot.
  int next_round() { return flags::slot_of_round(round_++); }
  // Post one phase for `call` and wait for every peer to reach it; throws (and
  // aborts this rank so peers stop waiting) on timeout, a dead peer, an aborted
  // peer or a peer that called something else.
  void phase(const CollCall& call);

  // The data steps of the slot schedules: plain copies on this thread.
  void publish(char* dst, const void* src, int64_t bytes) const { copy(dst, src, bytes); }
  void copy(void* dst, const void* src, int64_t bytes) const {
    if (bytes > 0 && dst != src) std::memcpy(dst, src, size_t(bytes));
  }

  // Registered buffers: the arena's bookkeeping (registered_arena.h).
  int64_t arena_alloc(int64_t bytes) { return registered_.alloc(bytes); }
  // Frees the block and gives its pages back to /dev/shm.
  void arena_free(int64_t offset);
  // Backs [offset, offset + bytes) of this rank's arena with memory; returns
  // "" or why not (a message that names the bytes needed and free).
  std::string arena_reserve(int64_t offset, int64_t bytes);
  // Offset of [p, p+bytes) in this rank's arena, or -1 if it is not inside.
  int64_t arena_offset(const void* p, int64_t bytes) const { return registered_.offset_of(p, bytes, arena(rank_)); }

  uint64_t phases() const { return seq_; }

  // How many CPUs this group's ranks may run on: the union of the affinity
  // masks each rank's creating thread had when the communicator was built.
  // Crowded: the ranks outnumber them, so some rank is always off a CPU and
  // a rank that waits yields its CPU at once instead of spinning first. A
  // mask changed later (taskset on a running rank) is not seen.
  int cpus() const { return cpus_; }
  bool crowded() const { return cpus_ < size_; }

  // A schedule found the ranks disagree (e.g. alltoall split sizes): abort this
  // rank like a failed wait does, and throw `msg`.
  [[noreturn]] void fail(const std::string& msg);

  // For the point-to-point engine, which waits on one peer at a time from any
  // thread: whether `peer` is still running (false only when we can see it
  // has exited), whether it has aborted, its pid; abort_self() marks this rank
  // failed (thread-safe) so peers stop waiting on it.
  bool peer_alive(int peer) const;
  bool peer_aborted(int peer) const;
  // The reason `peer` gave when it aborted (abort_self(reason)), or "" when it
  // gave none or has not aborted.
  std::string peer_abort_reason(int peer) const;
  // Whether `peer` has left the communicator (leave(): its group was
  // destroyed, or its ShmComm freed): it will send nothing more, and its
  // exit afterwards is not a failure.
  bool peer_left(int peer) const;
  int64_t pid(int peer) const { return pids_[peer]; }
  static constexpr size_t kAbortReasonBytes = 384;
  // The abort word: this rank's first abort stores it (release), after a
  // `reason` (at most kAbortReasonBytes - 1 bytes kept) written beside it in
  // this rank's segment header, so a peer that sees the word reads the whole
  // reason; later aborts change nothing. Peers name the reason in their error.
  void abort_self(const std::string& reason = "");
  // Fails this communicator for a cause outside it (a step of the caller's
  // own that this rank's peers wait on, like a host leader's call between
  // hosts): aborts this rank with `reason`, so peers waiting on it raise at
  // once naming it, and every later collective here raises with it. From
  // the thread that runs the collectives.
  void abort_with(const std::string& reason);
  // Marks this rank as gone from the communicator (idempotent; the destructor
  // calls it). Peers' receives from any source stop counting on this rank.
  // Only in the process that joined: a forked child (a DataLoader worker)
  // that destroys its inherited copy of the group just drops its mappings.
  void leave();
  // Whether this is the process that built the communicator (not a forked
  // child holding a copy). Only it may write anything peers read: the left
  // and abort words, the data, the pages of the registered arena.
  bool in_joining_process() const;

 private:
  static constexpr int64_t kHeaderBytes = 4096;
  flags::ControlBlock* control(int peer) const;
  // Reserves this rank's fixed parts (fixed_shm_bytes); throws if /dev/shm is short.
  void reserve_fixed(const Segment& own, const std::string& name) const;

  int rank_, size_;
  int64_t joined_pid_ = 0;  // getpid() of the process that built this communicator
  std::vector<int> global_ranks_;
  ShmOptions opts_;
  std::vector<Segment> segs_;
  std::vector<char*> base_;
  std::vector<int64_t> pids_;
  std::vector<bool> watch_;  // peers whose liveness we can see in /proc
  int cpus_ = 0;
  uint64_t seq_ = 0;
  uint64_t round_ = 0;
  Coll current_ = Coll::kBarrier;
  std::chrono::milliseconds current_timeout_{0};
  uint64_t deadline_ns_ = 0;
  std::string broken_;  // non-empty once a collective failed
  std::atomic<bool> aborted_{false};  // this process has stored (or is storing) the abort word

  RegisteredArena registered_{opts_.arena_bytes};
};

}  // namespace cpu_shm
}  // namespace fastpar
