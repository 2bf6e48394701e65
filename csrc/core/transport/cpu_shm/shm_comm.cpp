#include "shm_comm.h"

#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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

constexpr int kCpuMaskWords = CPU_SETSIZE / 64;

struct SegmentHeader {
  uint64_t magic;
  int64_t pid;
  int64_t rank;
  int64_t slot_bytes;
  int64_t arena_bytes;
  int64_t p2p_chunk_bytes;
  uint64_t left;  // set (release) by the owner in leave(); read by peers
  // The CPUs the owner's creating thread may run on (sched_getaffinity), bit c
  // of word c / 64 for CPU c; written before the segment's name is published.
  uint64_t cpus[kCpuMaskWords];
  // Why the owner aborted (NUL-terminated; empty: no reason given): written
  // once, before the owner's abort word, which publishes it (abort_self).
  char abort_reason[ShmComm::kAbortReasonBytes];
};
constexpr int64_t kControlOffset = 1024;  // ControlBlock after the header, 64-byte aligned
static_assert(sizeof(SegmentHeader) <= kControlOffset, "header overlaps the control block");
static_assert(kControlOffset + sizeof(flags::ControlBlock) <= 4096, "control block exceeds the header page");

// Spin without yielding for this long: a peer that is running (it has its own
// core) arrives within a few microseconds and we must not pay a syscall then.
// Beyond it we sched_yield on every poll, so that when ranks outnumber free
// cores the peer we wait for gets the core. Where the group's ranks
// outnumber the CPUs they may run on at all (ShmComm::crowded) some peer is
// always off a CPU, and the spin only delays it: waits yield at once. Past
// 1 ms the peer is clearly not running (descheduled, or busy elsewhere), and a
// yielding spinner still takes its share of a loaded machine's CPU from that
// peer, so we sleep 50 us per poll instead. It costs nothing when ranks have
// their own cores (they never wait that long).
constexpr uint64_t kSpinBeforeYieldNs = 20 * 1000;
constexpr uint64_t kYieldBeforeSleepNs = 1000 * 1000;
constexpr long kSleepNs = 50 * 1000;
// /proc/<pid>/stat is read at most this often while waiting on a peer.
constexpr uint64_t kLivenessPeriodNs = 5 * 1000 * 1000;

// This thread's CPUs as SegmentHeader::cpus. Every CPU where the mask cannot
// be read (a kernel with more CPUs than a cpu_set_t holds): a group is never
// called crowded on a guess.
void own_cpus(uint64_t* words) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    for (int w = 0; w < kCpuMaskWords; ++w) words[w] = ~0ull;
    return;
  }
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) words[c / 64] |= 1ull << (c % 64);
}

}  // namespace

ShmOptions default_shm_options(std::chrono::milliseconds timeout) {
  ShmOptions o;
  // 1 MiB slots (3 per rank, so 3 MiB of shm per rank whatever the message):
  // chunks stay in L2 while the phases stay few; the best slot size measured
  // (docs/measurements.md).
  o.slot_bytes = int64_t(1) << 20;
  // Address space only: tmpfs commits a page when it is first touched.
  o.arena_bytes = int64_t(512) << 20;
  // 256 KiB chunks, 4 per channel: a large message streams through 1 MiB of
  // ring per peer, the same footprint as one collective slot.
  o.p2p_chunk_bytes = int64_t(256) << 10;
  o.timeout = timeout;
  return o;
}

int64_t fixed_shm_bytes(const ShmOptions& o, int size) {
  const int64_t block = (128 + kP2PChunks * 64 + kP2PChunks * o.p2p_chunk_bytes + 4095) / 4096 * 4096;
  return 4096 + flags::kSlots * o.slot_bytes + int64_t(size - 1) * block;
}

// "/dev/shm has 1048576 bytes free of 67108864" for messages.
static std::string shm_room(const Segment& s) {
  const int64_t free_bytes = s.fs_free_bytes(), total = s.fs_total_bytes();
  if (free_bytes < 0) return "the free space of /dev/shm is unknown";
  return "/dev/shm has " + std::to_string(free_bytes) + " bytes free of " + std::to_string(total);
}

void ShmComm::reserve_fixed(const Segment& own, const std::string& name) const {
  // The pages this rank touches: header and slots, then its channel to each
  // peer (block q of its segment; its own block is never used).
  std::vector<std::pair<int64_t, int64_t>> ranges{{0, kHeaderBytes + flags::kSlots * opts_.slot_bytes}};
  const int64_t p2p0 = kHeaderBytes + flags::kSlots * opts_.slot_bytes + opts_.arena_bytes;
  for (int q = 0; q < size_; ++q)
    if (q != rank_) ranges.emplace_back(p2p0 + int64_t(q) * p2p_block_bytes(), p2p_block_bytes());
  for (const auto& r : ranges) {
    const int err = own.reserve(r.first, r.second);
    if (err == 0) continue;
    const int64_t need = fixed_shm_bytes(opts_, size_);
    throw std::runtime_error(
        "fastpar: init on rank " + std::to_string(global_ranks_[rank_]) + ": cannot reserve the " +
        std::to_string(need) + " bytes of shared memory this rank needs (segment /" + name + "): " + shm_room(own) +
        " (" + std::strerror(err) + "). Each rank needs 4096 + 3 x FASTPAR_SHM_SLOT_BYTES (" +
        std::to_string(opts_.slot_bytes) + ") + " + std::to_string(size_ - 1) +
        " peers x (4 x FASTPAR_SHM_P2P_CHUNK_BYTES (" + std::to_string(opts_.p2p_chunk_bytes) +
        ") + 4096): lower those (equal on every rank), or give /dev/shm more room (docker run --shm-size=...)");
  }
}

std::string ShmComm::arena_reserve(int64_t offset, int64_t bytes) {
  const int err = segs_[rank_].reserve(arena(rank_) - base_[rank_] + offset, bytes);
  if (err == 0) return "";
  return std::to_string(bytes) + " bytes do not fit in /dev/shm: " + shm_room(segs_[rank_]) + " (" +
         std::strerror(err) + "); free memory there, give it more room (docker run --shm-size=...), or allocate less";
}

void ShmComm::arena_free(int64_t offset) {
  // A forked child's copy of a registered tensor shares the parent's pages:
  // giving them back would zero the parent's data.
  if (!in_joining_process()) return;
  // The whole pages of the merged free range are unused by any buffer.
  const RegisteredArena::Range r = registered_.free(offset);
  if (r.bytes > 0) segs_[rank_].release(arena(rank_) - base_[rank_] + r.offset, r.bytes);
}

flags::ControlBlock* ShmComm::control(int peer) const {
  return reinterpret_cast<flags::ControlBlock*>(base_[peer] + kControlOffset);
}

namespace {

// This process's pid without a system call per collective (glibc no longer
// caches getpid()): read once, and again in every child fork() makes (an
// atfork handler; os.fork and multiprocessing's fork go through fork()).
std::atomic<int64_t> g_pid{0};
void refresh_pid() { g_pid.store(int64_t(getpid()), std::memory_order_relaxed); }
int64_t current_pid() {
  static const bool registered = [] {
    refresh_pid();
    pthread_atfork(nullptr, nullptr, refresh_pid);
    return true;
  }();
  (void)registered;
  return g_pid.load(std::memory_order_relaxed);
}

}  // namespace

namespace {

// FASTPAR_TEST_INIT_PAUSE="<phase>:<file>": at that phase of init, create
// <file> and sleep until a signal arrives (a handled one, e.g. SIGINT under
// Python, ends the pause and init goes on). The fault tests use it to kill a
// rank at a known point of init; unset, it costs one getenv per phase.
void test_pause(const char* phase) {
  const char* v = std::getenv("FASTPAR_TEST_INIT_PAUSE");
  if (!v) return;
  const std::string spec = v;
  const size_t colon = spec.find(':');
  if (colon == std::string::npos || spec.compare(0, colon, phase) != 0) return;
  if (FILE* f = std::fopen(spec.substr(colon + 1).c_str(), "w")) {
    std::fprintf(f, "%d\n", int(getpid()));
    std::fclose(f);
  }
  const timespec ts{3600, 0};
  while (nanosleep(&ts, nullptr) == 0) {
  }
}

}  // namespace

ShmComm::ShmComm(int rank, int size, std::vector<int> global_ranks, const Rendezvous& rv, ShmOptions opts)
    : rank_(rank), size_(size), global_ranks_(std::move(global_ranks)), opts_(opts) {
  if (size < 1 || size > kMaxShmRanks || rank < 0 || rank >= size || int(global_ranks_.size()) != size)
    throw std::invalid_argument("fastpar: bad communicator shape: rank " + std::to_string(rank) +
                                " of size " + std::to_string(size) + " (at most " + std::to_string(kMaxShmRanks) + " ranks per host)");
  const int64_t total =
      kHeaderBytes + flags::kSlots * opts_.slot_bytes + opts_.arena_bytes + int64_t(size) * p2p_block_bytes();
  const auto deadline = std::chrono::steady_clock::now() + opts_.timeout;
  // What a rank killed during init left (no survivor could remove it): this
  // user's segments whose creator is provably gone.
  sweep_dead_segments();
  const ProcessId self = this_process();
  joined_pid_ = current_pid();
  std::string job;
  std::vector<std::string> names(static_cast<size_t>(size));  // only this job's names: see below
  std::vector<ProcessId> ids(static_cast<size_t>(size));      // peers' ProcessIds, once announced
  ids[rank] = self;
  const std::string me = "fastpar: init on rank " + std::to_string(global_ranks_[rank_]) + ": ";
  auto who = [&](int q) {
    return "rank " + std::to_string(global_ranks_[q]) + (ids[q].pid > 0 ? " (pid " + std::to_string(ids[q].pid) + ")" : "");
  };
  // The ProcessId a peer announced under proc/<q> (before it could create
  // anything), fetched once it is there. An unparsable value is ignored: it
  // only means that peer's liveness is not watched.
  auto learn = [&](int q) {
    if (ids[q].pid > 0) return;
    const std::string key = "proc/" + std::to_string(q);
    try {
      if (!rv.check(key)) return;
      ProcessId id;
      if (parse_process(rv.get(key), &id)) ids[q] = id;
    } catch (...) {
    }
  };
  // Waits for `key`, polling the store (1 ms, backing off to 20 ms) so that a
  // peer that dies during init fails this rank within milliseconds instead of
  // the timeout: every peer that announced itself is checked between polls.
  auto wait_for = [&](const std::string& key, int peer, const char* what) {
    long nap_us = 1000;
    for (;;) {
      std::string store_error;
      try {
        if (rv.check(key)) {
          // Learn who the peers are while the store is up: if one dies later
          // with the store (rank 0 serving a TCPStore), its name is known.
          for (int q = 0; q < size_; ++q) learn(q);
          return;
        }
      } catch (const std::exception& e) {
        store_error = e.what();  // e.g. the store's server is gone: see whether a peer died first
      }
      for (int q = 0; q < size_; ++q) {
        if (q == rank_) continue;
        learn(q);
        if (process_gone(ids[q]))
          throw std::runtime_error(me + who(q) + " exited during init, while this rank waited for " + who(peer) +
                                   " to " + what + " (store key '" + key + "')");
      }
      if (std::chrono::steady_clock::now() >= deadline)
        throw std::runtime_error("fastpar: init on rank " + std::to_string(global_ranks_[rank_]) + " timed out after " +
                                 std::to_string(opts_.timeout.count()) +
                                 " ms waiting for " + who(peer) + " to " + what + " (store key '" + key + "')" +
                                 (store_error.empty() ? "" : ": " + store_error));
      const timespec ts{0, nap_us * 1000};
      nanosleep(&ts, nullptr);
      nap_us = std::min(nap_us * 2, 20000L);
    }
  };
  // On failure every name this group's ranks use or will use is unlinked:
  // each is provably of this group (this job id, a rank of it, the ProcessId
  // that rank announced or the name it published, both checked against the
  // form segment_name writes), and a failed init needs none of them. A peer
  // that is still alive and creates its segment later fails too (it reads
  // this rank's report) and removes its own.
  // When the store died with a peer (rank 0 serving the TCPStore, killed
  // before this rank learned the job id), nothing names the dead peer's
  // segment; but its creator is gone, so the sweep of dead creators' segments
  // removes it.
  auto cleanup_failed = [&] {
    sweep_dead_segments();
    for (int q = 0; q < size_; ++q) {
      if (!names[q].empty()) unlink_segment(names[q]);
      if (job.empty()) continue;
      learn(q);
      if (ids[q].pid > 0) unlink_segment(segment_name(job, q, ids[q]));
    }
  };
  // A rank that fails here says why under the key its peers wait for next
  // ("!" + the error), so they fail at once with its reason instead of
  // waiting out the timeout.
  bool published = false;
  auto report = [&](const std::string& why) {
    try {
      rv.set((published ? "mapped/" : "seg/") + std::to_string(rank), "!" + why);
    } catch (...) {
    }
  };
  auto check_peer = [&](const std::string& value, int peer, const std::string& key) {
    if (!value.empty() && value[0] == '!')
      throw std::runtime_error(me + "rank " + std::to_string(global_ranks_[peer]) + " failed (store key '" + key +
                               "'): " + printable(value.substr(1), 2000));
  };
  std::vector<ProcessId> name_ids(static_cast<size_t>(size));
  try {
    test_pause("start");
    // Announced before anything is created: whatever this rank creates later
    // has a name its peers can compute (job, rank, ProcessId), and they can
    // tell when it dies.
    rv.set("proc/" + std::to_string(rank), format_process(self));
    test_pause("announced");
    // Values from the store are not trusted (anything that reaches the store
    // can write to it): a name is opened, and unlinked, only if it is the
    // segment name of this job and of the rank that published it.
    if (rank == 0) {
      job = random_job_id();
      rv.set("job", job);
    } else {
      wait_for("job", 0, "publish the job id");
      const std::string value = rv.get("job");
      if (!valid_job_id(value))
        throw std::runtime_error(me + "the store's job id (key 'job', written by rank " +
                                 std::to_string(global_ranks_[0]) + ") is '" + printable(value) +
                                 "', not 16 hex digits: the store holds a value fastpar did not write");
      job = value;
    }
    names[rank] = segment_name(job, rank, self);
    segs_.resize(size_t(size));
    segs_[rank] = Segment::create(names[rank], size_t(total));
    reserve_fixed(segs_[rank], names[rank]);
    auto* h = reinterpret_cast<SegmentHeader*>(segs_[rank].data());
    *h = SegmentHeader{kMagic, int64_t(getpid()), rank, opts_.slot_bytes, opts_.arena_bytes, opts_.p2p_chunk_bytes, 0, {}};
    own_cpus(h->cpus);
    test_pause("created");
    rv.set("seg/" + std::to_string(rank), names[rank]);
    published = true;
    test_pause("published");
    name_ids[rank] = self;
    for (int q = 0; q < size; ++q) {
      if (q == rank) continue;
      const std::string key = "seg/" + std::to_string(q);
      wait_for(key, q, "create its shared-memory segment");
      const std::string value = rv.get(key);
      check_peer(value, q, key);
      if (!parse_segment_name(value, job, q, &name_ids[q]))
        throw std::runtime_error(me + "the store's segment name for rank " + std::to_string(global_ranks_[q]) +
                                 " (key '" + key + "') is '" + printable(value) + "', not " + kSegmentPrefix + job +
                                 "_r" + std::to_string(q) + "_p<pid>_t<start>_n<pidns> of this job; it was neither "
                                 "opened nor unlinked (a stale or foreign value in the store)");
      names[q] = value;
      segs_[q] = Segment::open(names[q], size_t(total));
    }
    rv.set("mapped/" + std::to_string(rank), "1");
    test_pause("mapped");
    for (int q = 0; q < size; ++q) {
      if (q == rank) continue;
      const std::string key = "mapped/" + std::to_string(q);
      wait_for(key, q, "map every segment");
      check_peer(rv.get(key), q, key);
    }
  } catch (const std::exception& e) {
    cleanup_failed();
    report(e.what());
    throw;
  }
  // Every rank has mapped every segment: no name is needed any more.
  for (const auto& n : names) unlink_segment(n);
  test_pause("ready");
  base_.resize(size_t(size));
  pids_.resize(size_t(size));
  watch_.assign(size_t(size), false);
  for (int q = 0; q < size; ++q) {
    base_[q] = segs_[q].data();
    const auto* h = reinterpret_cast<const SegmentHeader*>(base_[q]);
    if (h->pid != name_ids[q].pid)
      throw std::runtime_error("fastpar: segment of rank " + std::to_string(global_ranks_[q]) + " (/" + names[q] +
                               ") says it was created by pid " + std::to_string(h->pid) + " but its name says pid " +
                               std::to_string(name_ids[q].pid));
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
  uint64_t all[kCpuMaskWords] = {};
  for (int q = 0; q < size; ++q)
    for (int w = 0; w < kCpuMaskWords; ++w) all[w] |= reinterpret_cast<const SegmentHeader*>(base_[q])->cpus[w];
  cpus_ = 0;
  for (uint64_t w : all) cpus_ += __builtin_popcountll(w);
}

ShmComm::~ShmComm() {
  if (!base_.empty()) leave();
}

bool ShmComm::in_joining_process() const { return current_pid() == joined_pid_; }

void ShmComm::leave() {
  if (!in_joining_process()) return;
  auto* h = reinterpret_cast<SegmentHeader*>(base_[rank_]);
  HostMemory::store_release(&h->left, 1);
}

bool ShmComm::peer_left(int peer) const {
  const auto* h = reinterpret_cast<const SegmentHeader*>(base_[peer]);
  return HostMemory::load_acquire(&h->left) != 0;
}

void ShmComm::begin(Coll op, std::chrono::milliseconds timeout) {
  if (!in_joining_process())
    throw std::runtime_error("fastpar: " + std::string(coll_name(op)) + " on rank " +
                             std::to_string(global_ranks_[rank_]) + ": this process (pid " +
                             std::to_string(getpid()) + ") is a forked child of the rank that created the group (pid " +
                             std::to_string(joined_pid_) +
                             "); a child cannot run collectives on its parent's group (create a group of its own)");
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
  abort_self();
  throw std::runtime_error(msg);
}

bool ShmComm::peer_alive(int peer) const { return !watch_[peer] || liveness::process_alive(pids_[peer]); }

bool ShmComm::peer_aborted(int peer) const { return HostMemory::load_acquire(&control(peer)->abort) != 0; }

std::string ShmComm::peer_abort_reason(int peer) const {
  if (!peer_aborted(peer)) return "";  // the acquire that makes the reason visible
  const auto* h = reinterpret_cast<const SegmentHeader*>(base_[peer]);
  return printable(std::string(h->abort_reason, strnlen(h->abort_reason, kAbortReasonBytes)), kAbortReasonBytes);
}

void ShmComm::abort_self(const std::string& reason) {
  // Only the first abort of this process writes (a peer may be reading the
  // reason as soon as the word is set), and only the process that joined.
  if (!in_joining_process() || aborted_.exchange(true)) return;
  if (!reason.empty()) {
    auto* h = reinterpret_cast<SegmentHeader*>(base_[rank_]);
    const size_t n = std::min(reason.size(), kAbortReasonBytes - 1);
    std::memcpy(h->abort_reason, reason.data(), n);
    if (n < reason.size()) std::memcpy(h->abort_reason + n - 3, "...", 3);
    h->abort_reason[n] = '\0';
  }
  flags::abort_rank<HostMemory>(control(rank_), 1);
}

void ShmComm::abort_with(const std::string& reason) {
  if (broken_.empty()) broken_ = reason;
  abort_self(reason);
}

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
  const uint64_t spin_ns = crowded() ? 0 : kSpinBeforeYieldNs;
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
      } else if (now - start > spin_ns) {
        sched_yield();
      }
      if (now >= next_liveness) {
        next_liveness = now + kLivenessPeriodNs;
        // A peer that left (destroyed its group) will never post this phase either.
        if (!peer_alive(q) || peer_left(q)) return flags::WaitStatus::kPeerDead;
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
        fail(me + ": " + peer + " (pid " + std::to_string(pids_[q]) + ") " +
             (peer_left(q) ? "left the group (destroy_process_group)" : "exited") +
             " while this rank waited for it (timeout " + std::to_string(current_timeout_.count()) + " ms)");
      case flags::WaitStatus::kPeerAborted: {
        const int who = aborted >= 0 ? aborted : q;
        // A rank that aborted for a cause outside this communicator said
        // which (abort_with): that is the root cause, whichever rank this
        // one saw abort first (the others aborted because of it).
        for (int p = 0; p < size_; ++p) {
          const std::string why = p == rank_ ? "" : peer_abort_reason(p);
          if (!why.empty())
            fail(me + ": rank " + std::to_string(global_ranks_[p]) + " (pid " + std::to_string(pids_[p]) +
                 ") aborted the communicator: " + why);
        }
        // Name the root cause when it is a dead rank: the aborting rank
        // usually only saw that one die.
        std::string dead;
        for (int p = 0; p < size_; ++p)
          if (p != rank_ && !peer_alive(p))
            dead += " rank " + std::to_string(global_ranks_[p]) + " (pid " + std::to_string(pids_[p]) + ") has exited;";
        fail(me + ": rank " + std::to_string(global_ranks_[who]) +
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
