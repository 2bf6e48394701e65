#include "shm_comm.h"

#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "../liveness/process_liveness.h"
#include "host_memory.h"

namespace fastpar {
namespace cpu_shm {

namespace {

constexpr uint64_t kMagic = 0x66617374706172ull;  // "fastpar"

struct SegmentHeader {
  uint64_t magic;
  int64_t pid;
  int64_t rank;
  int64_t slot_bytes;
  int64_t arena_bytes;
  int64_t p2p_chunk_bytes;
};
constexpr int64_t kControlOffset = 512;  // ControlBlock after the header, 64-byte aligned
static_assert(sizeof(SegmentHeader) <= kControlOffset, "header overlaps the control block");
static_assert(kControlOffset + sizeof(flags::ControlBlock) <= 4096, "control block exceeds the header page");

// Spin without yielding for this long: a peer that is running (it has its own
// core) arrives within a few microseconds and we must not pay a syscall then.
// Beyond it we sched_yield on every poll, so that when ranks outnumber free
// cores (4 ranks on our 2-core CI) the peer we wait for gets the core. Past
// 1 ms the peer is clearly not running (descheduled, or busy elsewhere), and a
// yielding spinner still takes its share of a loaded machine's CPU from that
// peer, so we sleep 50 us per poll instead. It costs nothing when ranks have
// their own cores (they never wait that long).
constexpr uint64_t kSpinBeforeYieldNs = 20 * 1000;
constexpr uint64_t kYieldBeforeSleepNs = 1000 * 1000;
constexpr long kSleepNs = 50 * 1000;
// /proc/<pid>/stat is read at most this often while waiting on a peer.
constexpr uint64_t kLivenessPeriodNs = 5 * 1000 * 1000;

}  // namespace

ShmOptions default_shm_options(std::chrono::milliseconds timeout) {
  ShmOptions o;
  // 1 MiB slots (3 per rank, so 3 MiB of shm per rank whatever the message).
  // bench_distributed.py, 2 ranks, best of 3, plain-tensor allreduce busbw in
  // GB/s on the shared 2-core box (EPYC, 2 MiB L2 per core, 32 MiB L3), two
  // sweeps at load averages ~8 and ~4:
  //   slot      4 MiB        16 MiB       64 MiB
  //   256 KiB   0.92 / 2.57  0.40 / 2.29  0.27 / 3.27
  //   512 KiB     -  / 2.87    -  / 2.14    -  / 3.00
  //   1 MiB     3.80 / 3.92  1.48 / 3.15  2.08 / 3.72
  //   4 MiB     1.89 / 2.09  2.82 / 2.41  1.86 / 2.16
  //   16 MiB    1.64 /  -    1.26 /  -    1.79 /  -
  // 1 MiB is best or within the noise of it in both: chunks stay in L2 while
  // the phases stay few.
  o.slot_bytes = int64_t(1) << 20;
  // Address space only: tmpfs commits a page when it is first touched.
  o.arena_bytes = int64_t(512) << 20;
  // 256 KiB chunks, 4 per channel: a large message streams through 1 MiB of
  // ring per peer, the same footprint as one collective slot.
  o.p2p_chunk_bytes = int64_t(256) << 10;
  o.timeout = timeout;
  return o;
}

flags::ControlBlock* ShmComm::control(int peer) const {
  return reinterpret_cast<flags::ControlBlock*>(base_[peer] + kControlOffset);
}

ShmComm::ShmComm(int rank, int size, std::vector<int> global_ranks, const Rendezvous& rv, ShmOptions opts)
    : rank_(rank), size_(size), global_ranks_(std::move(global_ranks)), opts_(opts) {
  if (size < 1 || size > kMaxShmRanks || rank < 0 || rank >= size || int(global_ranks_.size()) != size)
    throw std::invalid_argument("fastpar: bad communicator shape: rank " + std::to_string(rank) +
                                " of size " + std::to_string(size) + " (at most " + std::to_string(kMaxShmRanks) + " ranks per host)");
  const int64_t total =
      kHeaderBytes + flags::kSlots * opts_.slot_bytes + opts_.arena_bytes + int64_t(size) * p2p_block_bytes();
  const auto t0 = std::chrono::steady_clock::now();
  auto remaining = [&] {
    const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    return std::max(std::chrono::milliseconds(1), opts_.timeout - spent);
  };
  std::vector<std::string> names(static_cast<size_t>(size));
  auto cleanup = [&] {
    for (const auto& n : names)
      if (!n.empty()) unlink_segment(n);
  };
  auto wait_for = [&](const std::string& key, int peer, const char* what) {
    try {
      rv.wait(key, remaining());
    } catch (const std::exception& e) {
      throw std::runtime_error("fastpar: init on rank " + std::to_string(global_ranks_[rank_]) +
                               " timed out after " + std::to_string(opts_.timeout.count()) +
                               " ms waiting for rank " + std::to_string(global_ranks_[peer]) + " to " +
                               what + " (store key '" + key + "'): " + e.what());
    }
  };
  try {
    std::string job;
    if (rank == 0) {
      job = random_job_id();
      rv.set("job", job);
    } else {
      wait_for("job", 0, "publish the job id");
      job = rv.get("job");
    }
    names[rank] = segment_name(job, rank);
    segs_.resize(size_t(size));
    segs_[rank] = Segment::create(names[rank], size_t(total));
    rv.set("seg/" + std::to_string(rank), names[rank]);
    auto* h = reinterpret_cast<SegmentHeader*>(segs_[rank].data());
    *h = SegmentHeader{kMagic, int64_t(getpid()), rank, opts_.slot_bytes, opts_.arena_bytes, opts_.p2p_chunk_bytes};
    for (int q = 0; q < size; ++q) {
      if (q == rank) continue;
      const std::string key = "seg/" + std::to_string(q);
      wait_for(key, q, "create its shared-memory segment");
      names[q] = rv.get(key);
      segs_[q] = Segment::open(names[q], size_t(total));
    }
    rv.set("mapped/" + std::to_string(rank), "1");
    for (int q = 0; q < size; ++q)
      if (q != rank) wait_for("mapped/" + std::to_string(q), q, "map every segment");
  } catch (...) {
    cleanup();
    throw;
  }
  // Every rank has mapped every segment: no name is needed any more.
  cleanup();
  base_.resize(size_t(size));
  pids_.resize(size_t(size));
  watch_.assign(size_t(size), false);
  for (int q = 0; q < size; ++q) {
    base_[q] = segs_[q].data();
    const auto* h = reinterpret_cast<const SegmentHeader*>(base_[q]);
    if (h->magic != kMagic || h->rank != q || h->slot_bytes != opts_.slot_bytes ||
        h->arena_bytes != opts_.arena_bytes || h->p2p_chunk_bytes != opts_.p2p_chunk_bytes)
      throw std::runtime_error("fastpar: segment of rank " + std::to_string(global_ranks_[q]) +
                               " has a different layout (slot_bytes " + std::to_string(h->slot_bytes) +
                               " vs " + std::to_string(opts_.slot_bytes) + ", registered bytes " +
                               std::to_string(h->arena_bytes) + " vs " + std::to_string(opts_.arena_bytes) +
                               ", p2p chunk bytes " + std::to_string(h->p2p_chunk_bytes) + " vs " +
                               std::to_string(opts_.p2p_chunk_bytes) + "): set FASTPAR_SHM_* alike on every rank");
    pids_[q] = h->pid;
    // A peer in another pid namespace (containers sharing /dev/shm) is not in
    // our /proc: never call it dead, rely on the timeout for it.
    watch_[q] = q != rank_ && liveness::process_alive(h->pid);
  }
}

ShmComm::~ShmComm() = default;

void ShmComm::begin(Coll op, std::chrono::milliseconds timeout) {
  if (!broken_.empty())
    throw std::runtime_error("fastpar: " + std::string(coll_name(op)) + " on rank " +
                             std::to_string(global_ranks_[rank_]) +
                             ": the communicator is unusable after an earlier error: " + broken_);
  current_ = op;
  current_timeout_ = timeout;
  deadline_ns_ = HostMemory::now_ns() + uint64_t(timeout.count()) * 1000000ull;
}

void ShmComm::fail(const std::string& msg) {
  broken_ = msg;
  flags::abort_rank<HostMemory>(control(rank_), 1);
  throw std::runtime_error(msg);
}

bool ShmComm::peer_alive(int peer) const { return !watch_[peer] || liveness::process_alive(pids_[peer]); }

bool ShmComm::peer_aborted(int peer) const { return HostMemory::load_acquire(&control(peer)->abort) != 0; }

void ShmComm::abort_self() { flags::abort_rank<HostMemory>(control(rank_), 1); }

int64_t ShmComm::p2p_block_bytes() const {
  // 2 counters + kP2PChunks headers (64 bytes each), then the chunks; whole
  // pages, so a channel's counters never share a page with another's data.
  const int64_t head = 128 + kP2PChunks * 64;
  return (head + kP2PChunks * opts_.p2p_chunk_bytes + 4095) / 4096 * 4096;
}

void ShmComm::phase(const CollCall& call) {
  const flags::OpDesc mine = call.desc(++seq_);
  flags::post<HostMemory>(control(rank_), mine);
  if (size_ == 1) return;
  const uint64_t start = HostMemory::now_ns();
  uint64_t next_liveness = start + kLivenessPeriodNs;
  int aborted = -1;
  for (int i = 1; i < size_; ++i) {
    const int q = (rank_ + i) % size_;  // stagger: ranks do not all poll rank 0 first
    auto poll = [&]() -> flags::WaitStatus {
      for (int p = 0; p < size_; ++p) {
        if (p != rank_ && HostMemory::load_acquire(&control(p)->abort) != 0) {
          aborted = p;
          return flags::WaitStatus::kPeerAborted;
        }
      }
      const uint64_t now = HostMemory::now_ns();
      if (now - start > kYieldBeforeSleepNs) {
        const timespec ts{0, kSleepNs};
        nanosleep(&ts, nullptr);  // EINTR just ends the nap early
      } else if (now - start > kSpinBeforeYieldNs) {
        sched_yield();
      }
      if (now >= next_liveness) {
        next_liveness = now + kLivenessPeriodNs;
        if (!peer_alive(q)) return flags::WaitStatus::kPeerDead;
      }
      return flags::WaitStatus::kOk;
    };
    flags::OpDesc theirs{};
    const flags::WaitStatus s = flags::wait_and_check<HostMemory>(control(q), mine, deadline_ns_, poll, &theirs);
    if (s == flags::WaitStatus::kOk) continue;
    const std::string me = "fastpar: " + std::string(coll_name(current_)) + " on rank " +
                           std::to_string(global_ranks_[rank_]);
    const std::string peer = "rank " + std::to_string(global_ranks_[q]);
    switch (s) {
      case flags::WaitStatus::kTimeout:
        fail(me + " timed out after " + std::to_string(current_timeout_.count()) + " ms waiting for " + peer +
             " (phase " + std::to_string(mine.seq) + ", timeout " + std::to_string(current_timeout_.count()) +
             " ms): it has not called the same collective, or is stuck");
      case flags::WaitStatus::kPeerDead:
        fail(me + ": " + peer + " (pid " + std::to_string(pids_[q]) + ") exited while this rank waited for it (timeout " +
             std::to_string(current_timeout_.count()) + " ms)");
      case flags::WaitStatus::kPeerAborted: {
        // Name the root cause when it is a dead rank: the aborting rank
        // usually only saw that one die.
        std::string dead;
        for (int p = 0; p < size_; ++p)
          if (p != rank_ && !peer_alive(p))
            dead += " rank " + std::to_string(global_ranks_[p]) + " (pid " + std::to_string(pids_[p]) + ") has exited;";
        fail(me + ": rank " + std::to_string(global_ranks_[aborted >= 0 ? aborted : q]) +
             " failed and aborted the communicator (" + (dead.empty() ? "see its error;" : dead) + " timeout " +
             std::to_string(current_timeout_.count()) + " ms)");
      }
      case flags::WaitStatus::kMismatch:
        fail(me + ": collective mismatch at phase " + std::to_string(mine.seq) + ": rank " +
             std::to_string(global_ranks_[rank_]) + " called " + describe(mine) + " but " + peer +
             " called " + describe(theirs));
      default:
        fail(me + ": unexpected wait status");
    }
  }
}

}  // namespace cpu_shm
}  // namespace fastpar
