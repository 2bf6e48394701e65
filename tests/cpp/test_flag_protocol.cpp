// Unit test of core/transport/flag_protocol.h over the host memory policy, with
// threads as ranks (the protocol cannot tell threads from processes: both see
// coherent memory). Built and run by ctest (CMakeLists.txt).
//
//   1. rotation: 4 ranks run 3000 one-phase rounds, each publishing a slot of
//      values derived from (rank, round) and checking every peer's slot after
//      the wait. A missing acquire/release or a slot reused too early shows up
//      as a wrong value.
//   2. timeout: a peer that never posts yields kTimeout, at the deadline.
//   3. abort: a peer that sets its abort word yields kPeerAborted.
//   4. mismatch: a peer posting another descriptor yields kMismatch.
//   5. gone after posting: a peer that posts its phase and then leaves, exits
//      or aborts (all seen between two spins) has still posted: kOk; one
//      that went without posting yields the poll's status.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "../../csrc/core/transport/flag_protocol.h"
#include "../../csrc/core/transport/cpu_shm/host_memory.h"

using fastpar::cpu_shm::HostMemory;
namespace flags = fastpar::flags;

#define CHECK(cond, ...)                                      \
  do {                                                        \
    if (!(cond)) {                                            \
      std::fprintf(stderr, "FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                      \
      std::fprintf(stderr, "\n");                             \
      std::abort();                                           \
    }                                                         \
  } while (0)

constexpr int kRanks = 4;
constexpr int kSlotWords = 512;

struct Rank {
  flags::ControlBlock cb{};
  uint64_t slots[flags::kSlots][kSlotWords];
};

static auto no_poll = [] { return flags::WaitStatus::kOk; };

static uint64_t value(int rank, uint64_t round, int i) { return (round * 1315423911ull) ^ (uint64_t(rank) << 40) ^ uint64_t(i); }

static void test_rotation() {
  static Rank ranks[kRanks];
  const uint64_t rounds = 3000;
  std::atomic<int> errors{0};
  auto body = [&](int r) {
    for (uint64_t round = 0; round < rounds; ++round) {
      const int k = flags::slot_of_round(round);
      for (int i = 0; i < kSlotWords; ++i) ranks[r].slots[k][i] = value(r, round, i);
      const flags::OpDesc d{round + 1, 7, -1, 1, 0, -1, -1};
      flags::post<HostMemory>(&ranks[r].cb, d);
      for (int q = 0; q < kRanks; ++q) {
        if (q == r) continue;
        flags::OpDesc theirs{};
        const auto s = flags::wait_and_check<HostMemory>(&ranks[q].cb, d, HostMemory::now_ns() + 10'000'000'000ull,
                                                         [] { std::this_thread::yield(); return flags::WaitStatus::kOk; },
                                                         &theirs);
        CHECK(s == flags::WaitStatus::kOk, "rank %d round %llu waiting on %d: status %d", r,
              (unsigned long long)round, q, int(s));
        for (int i = 0; i < kSlotWords; ++i)
          if (ranks[q].slots[k][i] != value(q, round, i)) errors.fetch_add(1);
      }
    }
  };
  std::vector<std::thread> ts;
  for (int r = 0; r < kRanks; ++r) ts.emplace_back(body, r);
  for (auto& t : ts) t.join();
  CHECK(errors.load() == 0, "%d stale or torn slot words", errors.load());
}

static void test_timeout() {
  flags::ControlBlock peer{};
  const uint64_t t0 = HostMemory::now_ns();
  const auto s = flags::wait_posted<HostMemory>(&peer, 1, t0 + 20'000'000ull, no_poll);
  const uint64_t waited = HostMemory::now_ns() - t0;
  CHECK(s == flags::WaitStatus::kTimeout, "status %d", int(s));
  CHECK(waited >= 20'000'000ull, "returned after %llu ns, before the 20 ms deadline", (unsigned long long)waited);
}

static void test_abort() {
  flags::ControlBlock peer{};
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    flags::abort_rank<HostMemory>(&peer, 3);
  });
  const auto s = flags::wait_posted<HostMemory>(&peer, 1, HostMemory::now_ns() + 10'000'000'000ull, no_poll);
  t.join();
  CHECK(s == flags::WaitStatus::kPeerAborted, "status %d", int(s));
}

static void test_mismatch() {
  flags::ControlBlock peer{};
  flags::post<HostMemory>(&peer, flags::OpDesc{1, 10, -1, 2, 0, -1, 0});
  const flags::OpDesc mine{1, 11, -1, 2, 0, -1, 0};
  flags::OpDesc theirs{};
  auto s = flags::wait_and_check<HostMemory>(&peer, mine, HostMemory::now_ns() + 1'000'000'000ull, no_poll, &theirs);
  CHECK(s == flags::WaitStatus::kMismatch && theirs.count == 10, "status %d count %lld", int(s),
        (long long)theirs.count);
  const flags::OpDesc unchecked{1, -1, -1, 2, 0, -1, 0};  // count -1: not compared
  s = flags::wait_and_check<HostMemory>(&peer, unchecked, HostMemory::now_ns() + 1'000'000'000ull, no_poll, &theirs);
  CHECK(s == flags::WaitStatus::kOk, "status %d", int(s));
}

static void test_gone_after_posting() {
  flags::ControlBlock peer{};
  // The poll sees the peer gone, but the peer posted phase 1 just before it
  // went (after the waiter's last look at the flag): the phase counts.
  auto posted_then_left = [&] {
    flags::post<HostMemory>(&peer, flags::OpDesc{1, 4, -1, 2, 0, -1, 0});
    return flags::WaitStatus::kPeerDead;
  };
  auto s = flags::wait_posted<HostMemory>(&peer, 1, HostMemory::now_ns() + 1'000'000'000ull, posted_then_left);
  CHECK(s == flags::WaitStatus::kOk, "posted, then left: status %d", int(s));
  // Posted phase 2 and then aborted (in a later phase): phase 2 still counts.
  flags::post<HostMemory>(&peer, flags::OpDesc{2, 4, -1, 2, 0, -1, 0});
  flags::abort_rank<HostMemory>(&peer, 1);
  s = flags::wait_posted<HostMemory>(&peer, 2, HostMemory::now_ns() + 1'000'000'000ull, no_poll);
  CHECK(s == flags::WaitStatus::kOk, "posted, then aborted: status %d", int(s));
  // Gone without posting phase 3: the poll's status stands.
  s = flags::wait_posted<HostMemory>(&peer, 3, HostMemory::now_ns() + 1'000'000'000ull,
                                     [] { return flags::WaitStatus::kPeerDead; });
  CHECK(s == flags::WaitStatus::kPeerAborted, "aborted before phase 3: status %d", int(s));
  flags::ControlBlock silent{};
  s = flags::wait_posted<HostMemory>(&silent, 1, HostMemory::now_ns() + 1'000'000'000ull,
                                     [] { return flags::WaitStatus::kPeerDead; });
  CHECK(s == flags::WaitStatus::kPeerDead, "left before phase 1: status %d", int(s));
}

int main() {
  test_rotation();
  test_timeout();
  test_abort();
  test_mismatch();
  test_gone_after_posting();
  std::printf("flag protocol: all tests passed\n");
  return 0;
}
