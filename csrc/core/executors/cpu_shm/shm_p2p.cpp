#include "shm_p2p.h"

#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <stdexcept>

#include "../../transport/cpu_shm/host_memory.h"

namespace fastpar {
namespace cpu_shm {

namespace {

// Layout of one channel block (ShmComm::p2p_block(owner, peer)); each counter
// on its own cache line, written only by the block's owner.
struct ChunkHeader {
  int64_t tag;
  int64_t total;   // bytes of the whole message
  int64_t offset;  // of this chunk in the message
  int64_t bytes;   // in this chunk
  char what[32];   // the sender's description ("float32 x 100"), for mismatch messages
};
static_assert(sizeof(ChunkHeader) <= 64, "chunk header exceeds its line");

uint64_t* posted_counter(char* block) { return reinterpret_cast<uint64_t*>(block); }       // owner -> peer
uint64_t* consumed_counter(char* block) { return reinterpret_cast<uint64_t*>(block + 64); }  // peer -> owner
ChunkHeader* header(char* block, uint64_t chunk) {
  return reinterpret_cast<ChunkHeader*>(block + 128 + int64_t(chunk % kP2PChunks) * 64);
}
char* chunk_data(char* block, uint64_t chunk, int64_t chunk_bytes) {
  return block + 128 + kP2PChunks * 64 + int64_t(chunk % kP2PChunks) * chunk_bytes;
}

// Liveness of waited-on peers is read from /proc at most this often.
constexpr uint64_t kLivenessPeriodNs = 5 * 1000 * 1000;
// After the last movement a waiter spins this long before it yields (at once
// in a crowded group: ShmComm::crowded); the progress thread yields this
// long, then naps: an idle wait must not take a core from the ranks working.
constexpr uint64_t kSpinNs = 50 * 1000;
constexpr long kNapNs = 50 * 1000;

}  // namespace

ShmP2P::ShmP2P(std::shared_ptr<ShmComm> comm)
    : comm_(std::move(comm)), rank_(comm_->rank()), size_(comm_->size()), out_(size_), in_(size_) {
  // A fresh segment is zero-filled, so every counter starts at 0 on both sides.
}

ShmP2P::~ShmP2P() {
  if (!comm_->in_joining_process()) {
    // A forked child's copy: the progress thread lives only in the parent,
    // and its mutex may have been copied locked. Joining would wait for ever.
    if (thread_.joinable()) thread_.detach();
    return;
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string ShmP2P::who() const { return "rank " + std::to_string(comm_->global_rank(rank_)); }

void ShmP2P::check_process(bool is_send) const {
  if (!comm_->in_joining_process())
    throw std::runtime_error(std::string(is_send ? "fastpar.send" : "fastpar.recv") + " on " + who() + ": this process (pid " + std::to_string(getpid()) +
                             ") is a forked child of the rank that created the group; a child cannot send or "
                             "receive on its parent's group (create a group of its own)");
}

std::shared_ptr<P2POp> ShmP2P::make_op(bool is_send, void* data, int64_t bytes, int peer, int64_t tag,
                                       std::string what, std::chrono::milliseconds timeout) const {
  const char* name = is_send ? "fastpar.send: dst is " : "fastpar.recv: src is ";
  if (peer < (is_send ? 0 : -1) || peer >= size_ || peer == rank_)
    throw std::invalid_argument(name + std::to_string(peer) + " but must be another rank of the " +
                                std::to_string(size_) + "-rank group (this is rank " + std::to_string(rank_) + ")");
  auto op = std::make_shared<P2POp>();
  op->is_send = is_send;
  op->peer = peer;
  op->tag = tag;
  op->data = static_cast<char*>(data);
  op->bytes = bytes;
  op->what = std::move(what);
  op->timeout = timeout;
  op->deadline_ns = HostMemory::now_ns() + uint64_t(timeout.count()) * 1000000ull;
  return op;
}

std::shared_ptr<P2POp> ShmP2P::send(const void* data, int64_t bytes, int dst, int64_t tag, std::string what,
                                    std::chrono::milliseconds timeout) {
  auto op = make_op(true, const_cast<void*>(data), bytes, dst, tag, std::move(what), timeout);
  check_process(op->is_send);
  std::unique_lock<std::mutex> g(mu_);
  if (!broken_.empty()) throw std::runtime_error(broken_);
  out_[dst].queue.push_back(op);
  ++pending_ops_;
  progress_locked();
  if (!op->done.load(std::memory_order_acquire)) start_thread();
  return op;
}

std::shared_ptr<P2POp> ShmP2P::recv(void* data, int64_t bytes, int src, int64_t tag, std::string what,
                                    std::chrono::milliseconds timeout) {
  auto op = make_op(false, data, bytes, src, tag, std::move(what), timeout);
  check_process(op->is_send);
  std::unique_lock<std::mutex> g(mu_);
  if (!broken_.empty()) throw std::runtime_error(broken_);
  ++pending_ops_;
  match_unexpected(op);
  if (!op->done.load(std::memory_order_acquire) && op->source < 0) recvs_.push_back(op);
  progress_locked();
  if (!op->done.load(std::memory_order_acquire)) start_thread();
  return op;
}

void ShmP2P::finish(const std::shared_ptr<P2POp>& op) {
  --pending_ops_;
  op->done.store(true, std::memory_order_release);
}

// A message with `total` bytes from `src` is about to land in `op`.
static std::string size_mismatch(const std::string& me, int src_global, const P2POp& op, int64_t total,
                                 const char* sender_what) {
  return "fastpar.recv on " + me + ": rank " + std::to_string(src_global) + " sent " + std::to_string(total) +
         " bytes (" + sender_what + ") with tag " + std::to_string(op.tag) + " but this receive expects " +
         std::to_string(op.bytes) + " bytes (" + op.what + ")";
}

// A new receive takes the oldest heap-buffered message it matches.
void ShmP2P::match_unexpected(const std::shared_ptr<P2POp>& op) {
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
    const auto& u = *it;
    if ((op->peer != -1 && op->peer != u->src) || op->tag != u->tag) continue;
    bool taken = false;
    for (auto& c : claimed_) taken = taken || c.first == u;
    if (taken) continue;
    if (u->total != op->bytes) fail(size_mismatch(who(), comm_->global_rank(u->src), *op, u->total, "see its send"));
    op->source = u->src;
    if (u->complete) {
      if (u->total > 0) std::memcpy(op->data, u->buf.data(), size_t(u->total));
      op->moved = u->total;
      unexpected_.erase(it);
      finish(op);
    } else {
      claimed_.emplace_back(u, op);  // completes when the rest of it arrives
    }
    return;
  }
}

std::shared_ptr<P2POp> ShmP2P::match(int src, int64_t tag) {
  for (auto it = recvs_.begin(); it != recvs_.end(); ++it) {
    if (((*it)->peer == -1 || (*it)->peer == src) && (*it)->tag == tag) {
      auto op = *it;
      recvs_.erase(it);
      return op;
    }
  }
  return nullptr;
}

bool ShmP2P::wants(int src) const {
  const Incoming& in = in_[src];
  if (in.op) return true;  // in the middle of a message for a posted receive
  if (in.heap)
    for (const auto& c : claimed_)
      if (c.first == in.heap) return true;
  for (const auto& r : recvs_)
    if (r->peer == -1 || r->peer == src) return true;
  return false;
}

bool ShmP2P::progress_send(int dst) {
  Outgoing& o = out_[dst];
  bool moved = false;
  char* block = comm_->p2p_block(rank_, dst);
  char* peer_block = comm_->p2p_block(dst, rank_);
  const int64_t chunk = comm_->p2p_chunk_bytes();
  while (!o.queue.empty()) {
    const auto& op = o.queue.front();
    const uint64_t consumed = HostMemory::load_acquire(consumed_counter(peer_block));
    if (consumed > o.posted)
      malformed(dst, "it says it has read " + std::to_string(consumed) + " chunks of this rank's channel to it, but " +
                         std::to_string(o.posted) + " were posted");
    if (o.posted - consumed >= uint64_t(kP2PChunks)) break;  // ring full
    const int64_t n = std::min(chunk, op->bytes - op->moved);
    ChunkHeader* h = header(block, o.posted);
    h->tag = op->tag;
    h->total = op->bytes;
    h->offset = op->moved;
    h->bytes = n;
    std::strncpy(h->what, op->what.c_str(), sizeof(h->what) - 1);
    h->what[sizeof(h->what) - 1] = '\0';
    if (n > 0) std::memcpy(chunk_data(block, o.posted, chunk), op->data + op->moved, size_t(n));
    HostMemory::store_release(posted_counter(block), ++o.posted);  // publishes the header and data above
    op->moved += n;
    moved = true;
    if (op->moved == op->bytes) {
      finish(op);
      o.queue.pop_front();
    }
  }
  return moved;
}

bool ShmP2P::progress_recv(int src) {
  Incoming& in = in_[src];
  char* peer_block = comm_->p2p_block(src, rank_);
  char* my_block = comm_->p2p_block(rank_, src);
  const int64_t chunk = comm_->p2p_chunk_bytes();
  bool moved = false;
  while (wants(src)) {
    const uint64_t posted = HostMemory::load_acquire(posted_counter(peer_block));
    if (posted == in.consumed) break;
    if (posted - in.consumed > uint64_t(kP2PChunks))  // also a counter that went backwards (wraps)
      malformed(src, "its channel counter says " + std::to_string(posted) + " chunks were posted, " +
                         std::to_string(in.consumed) + " were read, and at most " + std::to_string(kP2PChunks) +
                         " fit in the channel");
    // One copy of the header: the peer's memory may change under us, and
    // what is checked must be what is used.
    ChunkHeader h;
    std::memcpy(&h, header(peer_block, in.consumed), sizeof(h));
    const std::string sender_what(h.what, strnlen(h.what, sizeof(h.what)));
    const bool first = !in.op && !in.heap;  // the first chunk of a new message
    const int64_t want_offset = first ? 0 : in.total - in.remaining;
    if (h.total < 0 || h.offset != want_offset || (!first && (h.total != in.total || h.tag != in.tag)) ||
        h.bytes != std::min(chunk, h.total - h.offset))
      malformed(src, "chunk " + std::to_string(in.consumed) + " has tag " + std::to_string(h.tag) + ", total " +
                         std::to_string(h.total) + ", offset " + std::to_string(h.offset) + ", bytes " +
                         std::to_string(h.bytes) + " but fastpar would have written offset " +
                         std::to_string(want_offset) + (first ? "" : ", total " + std::to_string(in.total) +
                                                                         ", tag " + std::to_string(in.tag)) +
                         " and min(" + std::to_string(chunk) + ", total - offset) bytes");
    if (first) {  // who takes it?
      in.op = match(src, h.tag);
      in.remaining = in.total = h.total;
      in.tag = h.tag;
      if (in.op) {
        if (h.total != in.op->bytes)  // fail() fails in.op with the others
          fail(size_mismatch(who(), comm_->global_rank(src), *in.op, h.total, sender_what.c_str()));
        in.op->source = src;
      } else {
        // Someone wants a later message from src (wants() said so): buffer
        // this one. Grown as chunks arrive, not sized by the header's word.
        in.heap = std::make_shared<Unexpected>();
        in.heap->src = src;
        in.heap->tag = h.tag;
        in.heap->total = h.total;
        in.heap->buf.reserve(size_t(std::min<int64_t>(h.total, int64_t(64) << 20)));
        unexpected_.push_back(in.heap);
      }
    }
    char* dst;
    if (in.op) {
      dst = in.op->data;
    } else {
      if (int64_t(in.heap->buf.size()) < h.offset + h.bytes) in.heap->buf.resize(size_t(h.offset + h.bytes));
      dst = in.heap->buf.data();
    }
    if (h.bytes > 0) std::memcpy(dst + h.offset, chunk_data(peer_block, in.consumed, chunk), size_t(h.bytes));
    in.remaining -= h.bytes;
    if (in.op) in.op->moved += h.bytes;
    HostMemory::store_release(consumed_counter(my_block), ++in.consumed);  // the sender may reuse the chunk
    moved = true;
    if (in.remaining > 0) continue;
    if (in.op) {
      finish(in.op);
      in.op = nullptr;
    } else {
      in.heap->complete = true;
      for (auto it = claimed_.begin(); it != claimed_.end(); ++it) {
        if (it->first != in.heap) continue;
        const auto op = it->second;
        if (op->bytes > 0) std::memcpy(op->data, in.heap->buf.data(), size_t(op->bytes));
        op->moved = op->bytes;
        claimed_.erase(it);
        unexpected_.erase(std::find(unexpected_.begin(), unexpected_.end(), in.heap));
        finish(op);
        break;
      }
      in.heap = nullptr;
    }
  }
  return moved;
}

void ShmP2P::malformed(int peer, const std::string& what) {
  fail("fastpar.recv on " + who() + ": rank " + std::to_string(comm_->global_rank(peer)) + " (pid " +
       std::to_string(comm_->pid(peer)) + ") left a malformed point-to-point channel: " + what +
       "; its shared memory is corrupted, or it does not run fastpar's protocol");
}

bool ShmP2P::unread(int peer) const {
  return HostMemory::load_acquire(posted_counter(comm_->p2p_block(peer, rank_))) != in_[peer].consumed;
}

void ShmP2P::check_deadlines() {
  const uint64_t now = HostMemory::now_ns();
  const bool liveness = now >= next_liveness_ns_;
  if (liveness) next_liveness_ns_ = now + kLivenessPeriodNs;
  // Why `peer` will send or read nothing more, or kNo while it may. Chunks it
  // posted before it went are read first (a peer may post its last message
  // and exit at once), so a peer with unread chunks is never gone. Its state
  // is read before its chunks: a peer posts, then leaves or exits, so every
  // chunk posted before the state we saw is visible to unread().
  enum class Gone { kNo, kAborted, kLeft, kDied };
  auto gone = [&](int peer) {
    if (comm_->peer_aborted(peer)) return Gone::kAborted;
    const bool left = comm_->peer_left(peer);
    const bool died = !left && liveness && !comm_->peer_alive(peer);
    if (unread(peer)) return Gone::kNo;
    return left ? Gone::kLeft : died ? Gone::kDied : Gone::kNo;
  };
  auto pid = [&](int peer) { return " (pid " + std::to_string(comm_->pid(peer)) + ")"; };
  // " aborted the communicator: <its reason>" when it gave one (ShmComm::abort_with), else the generic words.
  auto aborted = [&](int peer, const std::string& otherwise) {
    const std::string why = comm_->peer_abort_reason(peer);
    return why.empty() ? " failed and aborted the communicator (" + otherwise + ")"
                       : pid(peer) + " aborted the communicator: " + why;
  };
  auto check = [&](const P2POp& op, int peer) {
    const std::string me = std::string("fastpar.") + (op.is_send ? "send" : "recv") + " on " + who();
    const std::string p = "rank " + std::to_string(comm_->global_rank(peer));
    const std::string state = op.what + ", tag " + std::to_string(op.tag) + ", " + std::to_string(op.moved) + " of " +
                              std::to_string(op.bytes) + " bytes moved";
    switch (gone(peer)) {
      case Gone::kAborted:
        fail(me + ": " + p + aborted(peer, "see its error; timeout " + std::to_string(op.timeout.count()) + " ms"));
      case Gone::kLeft:
        fail(me + ": " + p + pid(peer) + " left the group (destroy_process_group) while this rank waited for it (" +
             state + ")");
      case Gone::kDied:
        fail(me + ": " + p + pid(peer) + " exited while this rank waited for it (" + state + "; timeout " +
             std::to_string(op.timeout.count()) + " ms)");
      case Gone::kNo:
        break;
    }
    if (now > op.deadline_ns)
      fail(me + " timed out after " + std::to_string(op.timeout.count()) + " ms waiting for " + p + " (" + state +
           "): it has not posted the matching " + (op.is_send ? "recv" : "send") + ", or is stuck");
  };
  for (int q = 0; q < size_; ++q) {
    if (!out_[q].queue.empty()) check(*out_[q].queue.front(), q);
    if (in_[q].op) check(*in_[q].op, q);
  }
  for (const auto& c : claimed_) check(*c.second, c.first->src);
  for (const auto& r : recvs_) {
    if (r->peer >= 0) {
      check(*r, r->peer);
      continue;
    }
    // Any source: every peer that has not left could be the sender. One that
    // died or aborted fails the receive at once (waiting for the others could
    // hang for ever if it was the one); one that left is no longer counted.
    const std::string me = "fastpar.recv on " + who();
    const std::string what = " while this rank waited for a message from any source (" + r->what + ", tag " +
                             std::to_string(r->tag) + "; any rank could have sent it; timeout " +
                             std::to_string(r->timeout.count()) + " ms)";
    int senders = 0;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      const std::string p = "rank " + std::to_string(comm_->global_rank(q));
      switch (gone(q)) {
        case Gone::kAborted:
          fail(me + ": " + p + aborted(q, "see its error") + what);
        case Gone::kDied:
          fail(me + ": " + p + pid(q) + " exited without leaving the group" + what);
        case Gone::kLeft:
          break;
        case Gone::kNo:
          ++senders;
          break;
      }
    }
    if (senders == 0) fail(me + ": every other rank has left the group" + what);
    if (now > r->deadline_ns)
      fail(me + " timed out after " + std::to_string(r->timeout.count()) + " ms waiting for a message from any "
           "source (" + r->what + ", tag " + std::to_string(r->tag) + ")");
  }
}

bool ShmP2P::progress_locked() {
  if (!broken_.empty()) return false;
  bool moved = false;
  for (int i = 0; i < size_; ++i) {
    const int q = (next_src_ + i) % size_;
    if (q == rank_) continue;
    if (!out_[q].queue.empty()) moved = progress_send(q) || moved;
    moved = progress_recv(q) || moved;
  }
  next_src_ = (next_src_ + 1) % size_;
  if (!moved && pending()) check_deadlines();
  return moved;
}

void ShmP2P::fail(const std::string& msg) {
  broken_ = msg;
  comm_->abort_self();
  auto fail_op = [&](const std::shared_ptr<P2POp>& op) {
    if (!op || op->done.load(std::memory_order_acquire)) return;
    op->error = msg;
    finish(op);
  };
  for (auto& o : out_) {
    for (auto& op : o.queue) fail_op(op);
    o.queue.clear();
  }
  for (auto& in : in_) {
    fail_op(in.op);
    in.op = nullptr;
    in.heap = nullptr;
  }
  for (auto& r : recvs_) fail_op(r);
  recvs_.clear();
  for (auto& c : claimed_) fail_op(c.second);
  claimed_.clear();
  unexpected_.clear();
  throw std::runtime_error(msg);
}

void ShmP2P::poke() {
  std::unique_lock<std::mutex> g(mu_, std::try_to_lock);
  if (!g.owns_lock()) return;
  try {
    progress_locked();
  } catch (const std::runtime_error&) {
    // Recorded in the ops it failed; their wait() raises it.
  }
}

bool ShmP2P::wait(const std::shared_ptr<P2POp>& op, std::chrono::milliseconds timeout) {
  const uint64_t local_deadline =
      timeout.count() > 0 ? HostMemory::now_ns() + uint64_t(timeout.count()) * 1000000ull : 0;
  uint64_t idle_since = HostMemory::now_ns();
  const uint64_t spin_ns = comm_->crowded() ? 0 : kSpinNs;  // as ShmComm::phase's waits
  while (!op->done.load(std::memory_order_acquire)) {
    bool moved = false;
    {
      std::lock_guard<std::mutex> g(mu_);
      try {
        moved = progress_locked();
      } catch (const std::runtime_error&) {
        // fail() marked every pending op, ours included.
      }
      // Never spin on a failed engine, whatever state the op was left in.
      if (!broken_.empty() && !op->done.load(std::memory_order_acquire)) throw std::runtime_error(broken_);
    }
    if (op->done.load(std::memory_order_acquire)) break;
    const uint64_t now = HostMemory::now_ns();
    if (local_deadline && now > local_deadline) return false;
    if (moved) {
      idle_since = now;
    } else if (now - idle_since > spin_ns) {
      sched_yield();
    } else {
      HostMemory::pause();
    }
  }
  if (!op->error.empty()) throw std::runtime_error(op->error);
  return true;
}

void ShmP2P::start_thread() {
  if (thread_.joinable()) {
    cv_.notify_one();
    return;
  }
  thread_ = std::thread([this] { thread_main(); });
}

void ShmP2P::thread_main() {
  std::unique_lock<std::mutex> g(mu_);
  uint64_t idle_since = HostMemory::now_ns();
  while (!stop_) {
    if (!pending() || !broken_.empty()) {
      cv_.wait(g, [&] { return stop_ || (pending() && broken_.empty()); });
      idle_since = HostMemory::now_ns();
      continue;
    }
    bool moved = false;
    try {
      moved = progress_locked();
    } catch (const std::runtime_error&) {
      continue;  // recorded in the failed ops
    }
    const uint64_t now = HostMemory::now_ns();
    if (moved) idle_since = now;
    // Let waiters and posters in between rounds; nap once nothing has moved for a while.
    g.unlock();
    if (now - idle_since > kSpinNs) {
      const timespec ts{0, kNapNs};
      nanosleep(&ts, nullptr);
    } else {
      sched_yield();
    }
    g.lock();
  }
}

}  // namespace cpu_shm
}  // namespace fastpar
