// Point-to-point messages over the cpu_shm segments: send / recv / recv from
// any source between the ranks of one ShmComm. Torch-free; the c10d backend
// (torch/distributed/shm_engine_p2p.cpp) wraps each operation in a Work.
//
// Channels. Every ordered pair (s -> d) has one single-producer /
// single-consumer ring of kP2PChunks chunks of `p2p_chunk_bytes`, living in
// the sender's segment (ShmComm::p2p_channel). The sender writes a chunk and
// its header, then store-releases `posted`; the receiver load-acquires
// `posted`, reads, then store-releases `consumed` in ITS OWN segment's
// channel block for s. Each counter has one writer, so no atomics beyond
// acquire/release are needed, and the ring never overwrites a chunk before
// its reader is done: the sender only writes chunk i once consumed > i - K.
// A message of B bytes is ceil(B / chunk) chunks (one for B = 0), sent back to
// back, so messages on one channel arrive in the order they were sent.
//
// Matching (MPI's rules, which gloo follows): a receive takes the first
// message from its source (any source: from any) with its tag. A channel is
// only read while some posted receive could take from it, so a message
// nobody asked for waits in the sender's ring at no cost; when a receive needs
// a later message from the same sender, earlier messages with other tags are
// drained into heap buffers (the "unexpected" queue) and matched later.
//
// Peers that go. A receive from a named peer (and a send to it) fails when
// that peer exits, aborts or leaves the group (destroy_process_group) while
// the operation waits, once the chunks it posted before going are read. A
// receive from any source fails as soon as any peer that could have sent the
// message exits without leaving the group or aborts (naming it: it may have
// been the sender, and waiting for the others could hang); peers that left
// the group cleanly are no longer possible senders, and when every peer has
// left it fails too. A peer's channel is validated chunk by chunk: a header
// that fastpar would never write (sizes, offsets, counters out of range)
// fails the receive naming that peer.
//
// Progress. Operations make progress whenever any thread calls progress():
// the caller at post time (a message that fits in the ring completes before
// send() returns), Work::wait(), and a background thread that runs while any
// operation is pending, so an isend completes even if its owner goes on to
// other work before waiting. A failure (timeout, dead or aborted peer,
// size mismatch) fails every pending operation, aborts this rank so peers'
// collectives stop waiting, and makes later calls throw.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../../transport/cpu_shm/shm_comm.h"

namespace fastpar {
namespace cpu_shm {

// One posted send or receive. Fields after `done` are written under the
// engine's mutex and read after `done` is seen true (acquire).
struct P2POp {
  bool is_send = false;
  int peer = -1;  // destination, or source (-1: any source)
  int64_t tag = 0;
  char* data = nullptr;
  int64_t bytes = 0;
  std::string what;  // "float32 x 100", for messages
  uint64_t deadline_ns = 0;
  std::chrono::milliseconds timeout{0};

  std::atomic<bool> done{false};
  std::string error;  // non-empty: failed
  int source = -1;    // the sender, once a receive has matched a message
  int64_t moved = 0;  // bytes sent / received so far
};

class ShmP2P {
 public:
  explicit ShmP2P(std::shared_ptr<ShmComm> comm);
  ~ShmP2P();
  ShmP2P(const ShmP2P&) = delete;
  ShmP2P& operator=(const ShmP2P&) = delete;

  // Post an operation on `data` (bytes, kept alive by the caller until done);
  // `what` describes it in messages. Throws std::invalid_argument for a bad
  // peer, std::runtime_error once the engine has failed.
  std::shared_ptr<P2POp> send(const void* data, int64_t bytes, int dst, int64_t tag, std::string what,
                              std::chrono::milliseconds timeout);
  std::shared_ptr<P2POp> recv(void* data, int64_t bytes, int src, int64_t tag, std::string what,
                              std::chrono::milliseconds timeout);

  // Progress until `op` is done or `timeout` (0: the op's own deadline)
  // passes; throws std::runtime_error with the op's error if it failed.
  // Returns false on a local timeout that is shorter than the op's.
  bool wait(const std::shared_ptr<P2POp>& op, std::chrono::milliseconds timeout);
  // One non-blocking round of progress (skipped if another thread is in it).
  void poke();

 private:
  struct Unexpected {
    int src;
    int64_t tag;
    std::vector<char> buf;
    int64_t total;
    bool complete = false;
  };
  // What the receiver is in the middle of on one incoming channel.
  struct Incoming {
    uint64_t consumed = 0;  // chunks read (mirror of our consumed counter)
    std::shared_ptr<P2POp> op;         // the receive taking the current message, or
    std::shared_ptr<Unexpected> heap;  // the heap buffer taking it
    int64_t remaining = 0;             // bytes of the current message still to come
    int64_t total = 0, tag = 0;        // of the current message (its first chunk's header)
  };
  struct Outgoing {
    uint64_t posted = 0;
    std::deque<std::shared_ptr<P2POp>> queue;  // sends to this peer, in post order
  };

  // A checked, not yet posted operation (peer -1: any source, receives only).
  std::shared_ptr<P2POp> make_op(bool is_send, void* data, int64_t bytes, int peer, int64_t tag, std::string what,
                                 std::chrono::milliseconds timeout) const;
  // All called with mu_ held. progress_locked returns whether anything moved.
  bool progress_locked();
  bool progress_send(int dst);
  bool progress_recv(int src);
  bool wants(int src) const;  // some posted receive could take from src
  std::shared_ptr<P2POp> match(int src, int64_t tag);
  void match_unexpected(const std::shared_ptr<P2POp>& op);
  void finish(const std::shared_ptr<P2POp>& op);
  void check_deadlines();
  [[noreturn]] void fail(const std::string& msg);
  // A peer's channel holds something fastpar never writes (corrupted or
  // hostile memory): fail naming the peer instead of trusting it.
  [[noreturn]] void malformed(int peer, const std::string& what);
  // Whether `peer` posted chunks for this rank that are not read yet.
  bool unread(int peer) const;
  bool pending() const { return pending_ops_ > 0; }
  void start_thread();
  void thread_main();
  std::string who() const;
  // Throws unless this is the process that built the communicator.
  void check_process(bool is_send) const;

  std::shared_ptr<ShmComm> comm_;
  const int rank_, size_;
  std::mutex mu_;
  std::condition_variable cv_;  // wakes the progress thread when work is posted
  std::vector<Outgoing> out_;
  std::vector<Incoming> in_;
  std::deque<std::shared_ptr<P2POp>> recvs_;  // posted, unmatched receives, in post order
  std::deque<std::shared_ptr<Unexpected>> unexpected_;
  std::vector<std::pair<std::shared_ptr<Unexpected>, std::shared_ptr<P2POp>>> claimed_;  // heap msg -> its receive
  int pending_ops_ = 0;  // posted and not yet done
  int next_src_ = 0;      // where the next any-source scan starts (fairness)
  std::string broken_;
  uint64_t next_liveness_ns_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace cpu_shm
}  // namespace fastpar
