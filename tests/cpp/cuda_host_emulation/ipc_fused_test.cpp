// The fused one-shot and the graphed all_reduce (executors/cuda_ipc/
// ipc_fused_one_shot.h, ipc_graph.h) on the host: one thread per rank, one per block of each
// launch (emulated_ipc.h: blocks at once, block 0 often last). Checked:
//   * bit for bit against the in-order reduction for float32, bfloat16 and
//     int8 with 2-4 ranks, on 16-byte aligned buffers (the pack path) and on
//     buffers at an odd element offset (the scalar path), input or output
//     misaligned, in and out of place, counts that leave a scalar tail;
//   * a desync whose ranks run different block counts (so blocks of one rank
//     wait on block flags the other never posts and give up on its abort
//     word): every rank's status word equals its host mirror, the status is
//     kMismatch exactly when the mismatch record is there and intact, and at
//     least one rank (the first to compare) reports the mismatch;
//   * the graphed call (no host check ever follows a replay) sets the
//     failure word: a replay that fails (desync, timeout, a peer the host
//     watcher found dead) leaves its status there on every failed rank, a
//     replay after any failure (graphed or eager) leaves the earlier status
//     there and writes nothing, the next eager call fails without writing,
//     and replays that succeed leave the word at 0;
//   * a replay runs the eager call's schedule and grid at every size (the
//     one-shot up to the one-shot limit, the two-shot above it, an 8 MiB
//     slot's worth on the grid of ranks sharing an H100), both bit for bit
//     against the in-order reduction; ranks whose one-shot limits differ
//     fail a replay with kMismatch naming both graphed schedules;
//   * graphed and eager calls in another order on each rank fail on both
//     (timeout or abort) without writing, rather than hang;
//   * a peer that never comes among several (4 ranks, rank 3 absent): with
//     a thread per peer, the waits for the peers that came succeed and the
//     one for the absent peer fails; every caller records a timeout or its
//     peer's abort, mirror included, and a replay's failure word names it;
//   * all of the above in both forms of the block barriers (ipc_arena.h,
//     FlagForm: the peer's flag polled, or flags written into the waiter's
//     memory); and a rank in one form with its peers in the other fails
//     every call, eager or graphed, one-shot or two-shot, with kMismatch
//     (the record naming flags=waiter on one side only) or kPeerAborted,
//     long before the timeout, and writes nothing after.
// Exit status 0 = every check passed.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "emulated_checks.h"
#include "emulated_ipc.h"
#include "csrc/core/kernels/cpu_reduce.h"

#include "csrc/core/executors/cuda_ipc/ipc_allreduce.cpp"

using namespace fastpar;
using emulated::Arenas;
using emulated::comm_for;

namespace {

constexpr size_t kSlot = 4096;
constexpr uint32_t kMismatch = uint32_t(flags::WaitStatus::kMismatch);
constexpr uint32_t kAborted = uint32_t(flags::WaitStatus::kPeerAborted);

// Floats that round when summed, so a different order gives other bits.
template <typename T>
T value(int rank, int call, int64_t i) {
  const int v = (rank * 7 + call * 3 + int(i) * 5) % 13 - 6;
  const float f = float(v) * 0.1f + 0.013f * float(rank + 1);
  if constexpr (std::is_same_v<T, bf16>) return to_bf16(f);
  else if constexpr (std::is_same_v<T, float>) return f;
  else return T(v / 2);  // int8: small, so products of 4 ranks stay in range
}

template <typename T>
constexpr DType dtype_of() {
  return std::is_same_v<T, float> ? DType::F32 : std::is_same_v<T, bf16> ? DType::BF16 : DType::I8;
}

// One call's buffers: `in` and `out` at element offsets into 16-byte aligned storage.
struct Layout {
  int64_t in_off, out_off;
  bool in_place;
};

template <typename T>
std::vector<T> expected(int n, ReduceOp op, int call, int64_t count) {
  std::vector<std::vector<T>> ins(static_cast<size_t>(n), std::vector<T>(static_cast<size_t>(count)));
  std::vector<const T*> srcs;
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < count; ++i) ins[size_t(r)][size_t(i)] = value<T>(r, call, i);
    srcs.push_back(ins[size_t(r)].data());
  }
  std::vector<T> out(static_cast<size_t>(count));
  T* d = out.data();
  FASTPAR_DISPATCH_OP(op, [&] {
    cpu_reduce_range<T, kOp>(srcs.data(), n, &d, 1, 0, count, n);
  });
  return out;
}

// Every rank runs the same calls (eager fused, then graphed, per layout,
// count and op) and keeps its outputs; then each is compared bit for bit.
template <typename T>
void check_layouts(int n) {
  const Layout layouts[] = {{0, 0, false}, {0, 0, true}, {1, 1, false}, {1, 1, true}, {0, 1, false}, {1, 0, false}};
  const int64_t counts[] = {1, 15, 16, 33, 100, 517, 1000};
  std::vector<ReduceOp> ops;
  for (int o = 0; o < 5; ++o) ops.push_back(ReduceOp(o));
  struct Call {
    Layout l;
    int64_t count;
    ReduceOp op;
    bool graphed;
  };
  std::vector<Call> calls;
  for (const Layout& l : layouts)
    for (int64_t count : counts)
      for (bool graphed : {false, true}) calls.push_back({l, count, ops[calls.size() % ops.size()], graphed});
  Arenas arenas(n, kSlot);
  std::vector<std::vector<std::vector<T>>> got(static_cast<size_t>(n));
  std::vector<uint32_t> status(size_t(n), 0), word(size_t(n), 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cuda_ipc::IpcComm c = comm_for(arenas, r, kSlot);
      c.host_replay_failure = &word[size_t(r)];
      for (size_t k = 0; k < calls.size(); ++k) {
        const Call& call = calls[k];
        std::vector<uint4> in_store(size_t(call.count) * sizeof(T) / 16 + 2), out_store(in_store.size());
        T* in = reinterpret_cast<T*>(in_store.data()) + call.l.in_off;
        T* out = call.l.in_place ? in : reinterpret_cast<T*>(out_store.data()) + call.l.out_off;
        for (int64_t i = 0; i < call.count; ++i) in[i] = value<T>(r, int(k), i);
        const cudaError_t err =
            call.graphed ? cuda_ipc::allreduce_graphed(c, dtype_of<T>(), call.op, in, out, call.count, nullptr)
                         : cuda_ipc::allreduce_one_shot(c, dtype_of<T>(), call.op, in, out, call.count, nullptr);
        expect(err == cudaSuccess, "layouts: the call was enqueued");
        got[size_t(r)].emplace_back(out, out + call.count);
      }
      cuda_ipc::read_status(c, nullptr, &status[size_t(r)]);
    });
  }
  for (auto& t : threads) t.join();
  char what[200];
  // The form ran: its words were written, the other form's inboxes not.
  const bool waiter = emulated::g_flag_form == cuda_ipc::FlagForm::kWaiterMemory;
  for (int q = 0; q < n; ++q) {
    void* base = arenas.bases[size_t(q)];
    for (int r = 0; r < n; ++r) {
      if (r == q) continue;
      const uint64_t eager = cuda_ipc::inbox_of(base)->word[0][r];
      const uint64_t graph = cuda_ipc::graph_control_of(base, kSlot)->inbox.word[0][r];
      std::snprintf(what, sizeof(what), "layouts n=%d, %s: rank %d's inbox holds rank %d's eager %lu, graphed %lu", n,
                    emulated::flag_form_name(emulated::g_flag_form), q, r, (unsigned long)eager,
                    (unsigned long)graph);
      expect(waiter ? eager > 0 && graph > 0 : eager == 0 && graph == 0, what);
    }
  }
  for (int r = 0; r < n; ++r) {
    std::snprintf(what, sizeof(what), "layouts %s n=%d: rank %d status %u, failure word %u", dtype_name(dtype_of<T>()),
                  n, r, status[size_t(r)], word[size_t(r)]);
    expect(status[size_t(r)] == 0 && word[size_t(r)] == 0, what);
    for (size_t k = 0; k < calls.size(); ++k) {
      const Call& call = calls[k];
      const std::vector<T> e = expected<T>(n, call.op, int(k), call.count);
      std::snprintf(what, sizeof(what), "layouts %s n=%d rank %d: %s count %ld op %s in+%ld %s",
                    dtype_name(dtype_of<T>()), n, r, call.graphed ? "graphed" : "fused", long(call.count),
                    op_name(call.op), long(call.l.in_off),
                    call.l.in_place ? "in place" : call.l.out_off ? "out+1" : "out+0");
      expect(std::memcmp(got[size_t(r)][k].data(), e.data(), e.size() * sizeof(T)) == 0, what);
    }
  }
}

// What a failed rank left: status word, host mirror, mismatch record.
struct Outcome {
  uint32_t status = 0, mirror = 0;
  cuda_ipc::MismatchRecord record{};
};

// The checks every desync shares; returns the ranks that report kMismatch.
int check_desync_outcome(const std::vector<Outcome>& o, const std::vector<int64_t>& count, int64_t aux,
                         const char* test) {
  const int n = int(o.size());
  char what[200];
  int mismatched = 0;
  for (int r = 0; r < n; ++r) {
    const Outcome& x = o[size_t(r)];
    std::snprintf(what, sizeof(what), "%s n=%d: rank %d status %u, host mirror %u", test, n, r, x.status, x.mirror);
    expect(x.status == x.mirror && (x.status == kMismatch || x.status == kAborted), what);
    const int peer = int(x.record.peer_plus_one) - 1;
    if (x.status == kMismatch) {
      ++mismatched;
      std::snprintf(what, sizeof(what), "%s n=%d: rank %d's record names peer %d with its call", test, n, r, peer);
      expect(peer >= 0 && peer < n && peer != r && x.record.mine.aux == aux && x.record.theirs.aux == aux &&
                 x.record.mine.count == count[size_t(r)] && x.record.theirs.count == count[size_t(peer)] &&
                 count[size_t(peer)] != count[size_t(r)],
             what);
    } else {
      std::snprintf(what, sizeof(what), "%s n=%d: rank %d ended with %u but has a mismatch record", test, n, r,
                    x.status);
      expect(x.record.peer_plus_one == 0, what);
    }
  }
  std::snprintf(what, sizeof(what), "%s n=%d: no rank reports the mismatch", test, n);
  expect(mismatched > 0, what);
  return mismatched;
}

// Rank 0 calls with 40 floats (3 blocks at 64 bytes a block), the others
// with 200 (13 blocks): the others' blocks 3..12 wait for block flags rank 0
// never posts and give up when a peer aborts, racing their own block 0's
// descriptor check. Then every rank replays a graphed call: it leaves the
// status in the failure word and its output alone; then an eager call: it
// fails at once and leaves its output alone. Eager or graphed, the grid is
// fused_blocks', and 40 and 200 floats cut into the same ranges (4 packs a
// block), so the desync keeps the cut (emulated_checks.h).
void check_desync(int n, bool graphed) {
  Arenas arenas(n, kSlot);
  std::vector<Outcome> o(static_cast<size_t>(n));
  std::vector<cuda_ipc::IpcComm> comms;
  std::vector<int64_t> count(static_cast<size_t>(n));
  std::vector<int> untouched(size_t(n), 0), eager_untouched(size_t(n), 0);
  std::vector<uint32_t> word(size_t(n), 0), word_failed(size_t(n), 0);
  for (int r = 0; r < n; ++r) {
    count[size_t(r)] = r != 0 ? 200 : 40;
    comms.push_back(comm_for(arenas, r, kSlot));
    comms.back().timeout_ns = 20ull * 1000 * 1000 * 1000;  // never reached: the first to compare fails everyone
    comms.back().host_status = &o[size_t(r)].mirror;
    comms.back().host_mismatch = &o[size_t(r)].record;
    comms.back().host_replay_failure = &word[size_t(r)];
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cuda_ipc::IpcComm& c = comms[size_t(r)];
      std::vector<float> in(200, 1.0f);
      const int64_t k = count[size_t(r)];
      if (graphed) cuda_ipc::allreduce_graphed(c, DType::F32, ReduceOp::SUM, in.data(), in.data(), k, nullptr);
      else cuda_ipc::allreduce_one_shot(c, DType::F32, ReduceOp::SUM, in.data(), in.data(), k, nullptr);
      cuda_ipc::read_status(c, nullptr, &o[size_t(r)].status);
      word_failed[size_t(r)] = __atomic_load_n(&word[size_t(r)], __ATOMIC_ACQUIRE);
    });
  }
  for (auto& t : threads) t.join();
  const char* test = graphed ? "graphed desync" : "fused desync";
  check_desync_outcome(o, count, emulated::fused_aux(graphed ? kAuxGraphed : kAuxFused), test);
  threads.clear();
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::vector<float> in(200, 1.0f), out(200, -7.0f), eager(200, -7.0f);
      cuda_ipc::allreduce_graphed(comms[size_t(r)], DType::F32, ReduceOp::SUM, in.data(), out.data(), 200, nullptr);
      untouched[size_t(r)] = std::all_of(out.begin(), out.end(), [](float v) { return v == -7.0f; });
      cuda_ipc::allreduce_one_shot(comms[size_t(r)], DType::F32, ReduceOp::SUM, in.data(), eager.data(), 200,
                                   nullptr);
      eager_untouched[size_t(r)] = std::all_of(eager.begin(), eager.end(), [](float v) { return v == -7.0f; });
    });
  }
  for (auto& t : threads) t.join();
  char what[200];
  for (int r = 0; r < n; ++r) {
    const uint32_t s = o[size_t(r)].status;
    std::snprintf(what, sizeof(what), "%s n=%d: rank %d's failed call left %u in the failure word, status %u", test,
                  n, r, word_failed[size_t(r)], s);
    expect(word_failed[size_t(r)] == (graphed ? s : 0u), what);
    std::snprintf(what, sizeof(what), "%s n=%d: rank %d's next replay left %u in the failure word, status %u", test,
                  n, r, word[size_t(r)], s);
    expect(word[size_t(r)] == s, what);
    std::snprintf(what, sizeof(what), "%s n=%d: rank %d's replay after the failure wrote its output", test, n, r);
    expect(untouched[size_t(r)] != 0, what);
    std::snprintf(what, sizeof(what), "%s n=%d: rank %d's eager call after the replay wrote its output", test, n, r);
    expect(eager_untouched[size_t(r)] != 0, what);
    std::snprintf(what, sizeof(what), "%s n=%d: rank %d's status changed to %u", test, n, r, o[size_t(r)].mirror);
    expect(o[size_t(r)].mirror == s, what);
  }
}

// Rank 0 replays alone: the peer never comes (a timeout), or the host's peer
// watcher raises kPeerDead in its host abort word. Either way rank 0 records
// it, mirror and failure word included.
void check_lone_replay(bool peer_dead) {
  Arenas arenas(2, kSlot);
  uint32_t status = 0, mirror = 0, word = 0;
  uint64_t host_abort = 0;
  std::thread watcher;
  if (peer_dead)
    watcher = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      __atomic_store_n(&host_abort, uint64_t(flags::WaitStatus::kPeerDead), __ATOMIC_RELEASE);
    });
  cuda_ipc::IpcComm c = comm_for(arenas, 0, kSlot);
  c.timeout_ns = peer_dead ? 20ull * 1000 * 1000 * 1000 : 200ull * 1000 * 1000;
  c.host_status = &mirror;
  c.host_abort = &host_abort;
  c.host_replay_failure = &word;
  std::vector<float> in(100, 1.0f);
  cuda_ipc::allreduce_graphed(c, DType::F32, ReduceOp::SUM, in.data(), in.data(), 100, nullptr);
  cuda_ipc::read_status(c, nullptr, &status);
  if (watcher.joinable()) watcher.join();
  const flags::WaitStatus want = peer_dead ? flags::WaitStatus::kPeerDead : flags::WaitStatus::kTimeout;
  char what[200];
  std::snprintf(what, sizeof(what), "lone replay (%s): status %u, mirror %u", peer_dead ? "dead peer" : "timeout",
                status, mirror);
  expect(status == uint32_t(want) && mirror == status, what);
  std::snprintf(what, sizeof(what), "lone replay (%s): failure word %u", peer_dead ? "dead peer" : "timeout", word);
  expect(word == status, what);
}

// Rank 0 replays G then calls E (eager fused), rank 1 calls E then replays
// G: each waits for flags the other posts only after its own wait. Both fail
// at the timeout or on the other's abort, nothing is written, and each
// rank's replay sets its failure word (docs/cuda.md, CUDA graphs: the
// combined order must be the same on every rank).
void check_misordered() {
  Arenas arenas(2, kSlot);
  uint32_t status[2] = {0, 0}, mirror[2] = {0, 0}, word[2] = {0, 0};
  int untouched[2] = {0, 0};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      cuda_ipc::IpcComm c = comm_for(arenas, r, kSlot);
      c.timeout_ns = 300ull * 1000 * 1000;
      c.host_status = &mirror[r];
      c.host_replay_failure = &word[r];
      std::vector<float> in(100, 1.0f), g(100, -7.0f), e(100, -7.0f);
      for (int k = 0; k < 2; ++k) {
        const bool graph_now = (k == 0) == (r == 0);
        if (graph_now) cuda_ipc::allreduce_graphed(c, DType::F32, ReduceOp::SUM, in.data(), g.data(), 100, nullptr);
        else cuda_ipc::allreduce_one_shot(c, DType::F32, ReduceOp::SUM, in.data(), e.data(), 100, nullptr);
      }
      cuda_ipc::read_status(c, nullptr, &status[r]);
      untouched[r] = std::all_of(g.begin(), g.end(), [](float v) { return v == -7.0f; }) &&
                     std::all_of(e.begin(), e.end(), [](float v) { return v == -7.0f; });
    });
  }
  for (auto& t : threads) t.join();
  char what[200];
  for (int r = 0; r < 2; ++r) {
    const uint32_t s = status[r];
    std::snprintf(what, sizeof(what), "misordered: rank %d status %u, mirror %u, outputs untouched %d, failure word %u",
                  r, s, mirror[r], untouched[r], word[r]);
    expect((s == uint32_t(flags::WaitStatus::kTimeout) || s == kAborted) && mirror[r] == s && untouched[r] != 0 &&
               word[r] != 0,
           what);
  }
}

// Ranks 0-2 of 4 call, rank 3 never does. With a thread per peer every
// block's barrier waits for ranks 1-3 (or 0-2) at once on the GPU, in both
// orders here (odd blocks wait in reverse: the absent peer first, then the
// others stop on the status word); with thread 0's loop, in rank order. Every caller fails with a timeout (it gave up on rank 3) or the
// abort of a peer that did, its mirror equal, at least one with the timeout.
void check_missing_peer(bool graphed) {
  constexpr int n = 4;
  Arenas arenas(n, kSlot);
  uint32_t status[n] = {}, mirror[n] = {}, word[n] = {};
  std::vector<std::thread> threads;
  for (int r = 0; r < n - 1; ++r) {
    threads.emplace_back([&, r] {
      cuda_ipc::IpcComm c = comm_for(arenas, r, kSlot);
      c.timeout_ns = 300ull * 1000 * 1000;
      c.host_status = &mirror[r];
      c.host_replay_failure = &word[r];
      std::vector<float> in(1000, 1.0f);  // kFusedMaxBlocks blocks, eager or graphed (comm_for: 64 bytes a block)
      if (graphed) cuda_ipc::allreduce_graphed(c, DType::F32, ReduceOp::SUM, in.data(), in.data(), 1000, nullptr);
      else cuda_ipc::allreduce_one_shot(c, DType::F32, ReduceOp::SUM, in.data(), in.data(), 1000, nullptr);
      cuda_ipc::read_status(c, nullptr, &status[r]);
    });
  }
  for (auto& t : threads) t.join();
  const char* test = graphed ? "missing peer, graphed" : "missing peer, eager";
  char what[200];
  int timeouts = 0;
  for (int r = 0; r < n - 1; ++r) {
    const uint32_t s = status[r];
    timeouts += s == uint32_t(flags::WaitStatus::kTimeout);
    std::snprintf(what, sizeof(what), "%s: rank %d status %u, mirror %u", test, r, s, mirror[r]);
    expect((s == uint32_t(flags::WaitStatus::kTimeout) || s == kAborted) && mirror[r] == s, what);
    std::snprintf(what, sizeof(what), "%s: rank %d's failure word %u, status %u", test, r, word[r], s);
    expect(word[r] == (graphed ? s : 0u), what);
  }
  std::snprintf(what, sizeof(what), "%s: %d of the callers timed out on the absent peer", test, timeouts);
  expect(timeouts >= 1, what);
}

// Rank 0 in one form of the block barriers, its peers in the other
// (`waiter0`: rank 0 writes into the waiters' memory): an eager call and a
// replay of the same all_reduce (`two_shot`: above the one-shot limit), then
// the same again on the failed communicators. Every rank fails the first
// with kMismatch or a peer's abort, well before the 20 s timeout, at least
// one with the mismatch, whose record names flags=waiter on one side only;
// nothing is written after the failure.
void check_form_mix(int n, bool waiter0, bool graphed, bool two_shot) {
  using cuda_ipc::FlagForm;
  Arenas arenas(n, kSlot);
  std::vector<Outcome> o(static_cast<size_t>(n));
  std::vector<uint32_t> word(size_t(n), 0);
  std::vector<int> untouched(size_t(n), 0);
  const int64_t count = two_shot ? 600 : 200;  // 2400 bytes: above the 2 KiB limit below
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cuda_ipc::IpcComm c = comm_for(arenas, r, kSlot);
      c.flag_form = (r == 0) == waiter0 ? FlagForm::kWaiterMemory : FlagForm::kPollPeer;
      c.fused_two_shot = true;
      c.host_status = &o[size_t(r)].mirror;
      c.host_mismatch = &o[size_t(r)].record;
      c.host_replay_failure = &word[size_t(r)];
      std::vector<float> in(size_t(count), 1.0f), out(size_t(count), -7.0f);
      const int64_t limit = 2048;
      for (int k = 0; k < 2; ++k) {
        if (graphed) cuda_ipc::allreduce_graphed(c, DType::F32, ReduceOp::SUM, in.data(), out.data(), count, nullptr,
                                                 limit);
        else if (two_shot) cuda_ipc::allreduce_two_shot(c, DType::F32, ReduceOp::SUM, in.data(), out.data(), count,
                                                         nullptr);
        else cuda_ipc::allreduce_one_shot(c, DType::F32, ReduceOp::SUM, in.data(), out.data(), count, nullptr);
        if (k == 0) {
          cuda_ipc::read_status(c, nullptr, &o[size_t(r)].status);
          std::fill(out.begin(), out.end(), -7.0f);
        }
      }
      untouched[size_t(r)] = std::all_of(out.begin(), out.end(), [](float v) { return v == -7.0f; });
    });
  }
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char test[120], what[240];
  std::snprintf(test, sizeof(test), "form mix (rank 0 %s, %s %s)", waiter0 ? "waiter" : "peer",
                graphed ? "graphed" : "eager", two_shot ? "two-shot" : "one-shot");
  int mismatched = 0;
  for (int r = 0; r < n; ++r) {
    const Outcome& x = o[size_t(r)];
    std::snprintf(what, sizeof(what), "%s n=%d: rank %d status %u, mirror %u, failure word %u", test, n, r, x.status,
                  x.mirror, word[size_t(r)]);
    expect((x.status == kMismatch || x.status == kAborted) && x.mirror == x.status &&
               word[size_t(r)] == (graphed ? x.status : 0u),
           what);
    std::snprintf(what, sizeof(what), "%s n=%d: rank %d wrote its output after the failure", test, n, r);
    expect(untouched[size_t(r)] != 0, what);
    if (x.status != kMismatch) continue;
    ++mismatched;
    const bool mine = describe(x.record.mine).find("flags=waiter") != std::string::npos;
    const bool theirs = describe(x.record.theirs).find("flags=waiter") != std::string::npos;
    const int peer = int(x.record.peer_plus_one) - 1;
    std::snprintf(what, sizeof(what), "%s n=%d: rank %d's record: %s against peer %d's %s", test, n, r,
                  describe(x.record.mine).c_str(), peer, describe(x.record.theirs).c_str());
    expect(mine != theirs && mine == ((r == 0) == waiter0) && peer >= 0 && peer < n && peer != r &&
               x.record.mine.count == count && x.record.theirs.count == count,
           what);
  }
  std::snprintf(what, sizeof(what), "%s n=%d: no rank reports the mismatch", test, n);
  expect(mismatched > 0, what);
  std::snprintf(what, sizeof(what), "%s n=%d: the ranks took %.2f s to fail (timeout 20 s)", test, n, secs);
  expect(secs < 5.0, what);
}

// A replay runs the schedule and grid of the eager call of its size
// (allreduce_graphed, ipc_graph.h): the one-shot up to the one-shot limit,
// the fused two-shot above it, up to a full 8 MiB slot, on the grid of ranks
// sharing an H100 at the default 16 KiB a block. Every rank runs, per size
// (both sides of the limit, an odd size, the full slot), the eager call
// (the fused forms) and then the graphed one on the same input, the ranks
// drifting apart by up to a call; each call's kernel and grid are recorded
// (emulated_ipc.h, cuda_ipc::g_last_allreduce) and compared, and both outputs
// bit for bit against the in-order reduction, in and out of place, aligned
// and at an odd element offset.
template <typename T>
void check_graph_shapes(int n) {
  // Large enough for one-shot's limit + 1 at 2 ranks (2 MiB) within a slot;
  // ThreadSanitizer, which instruments every element access, gets the
  // smallest such slot.
  constexpr size_t kBigSlot = size_t(kThreadSanitizer ? 4 : 8) << 20;
  const int64_t es = int64_t(sizeof(T)), limit = cuda_ipc::default_one_shot_max_bytes(n) / es;
  const int64_t full = int64_t(kBigSlot) / es;
  const int64_t counts[] = {1, 1000, limit, limit + 1, full / 3 + 5, full, full - 1, limit - 3};
  constexpr int kCalls = int(sizeof(counts) / sizeof(counts[0]));
  Arenas arenas(n, kBigSlot);
  struct Got {
    cuda_ipc::AllreduceShape eager, graphed;
    std::vector<T> eager_out, graphed_out;
  };
  std::vector<std::vector<Got>> got(static_cast<size_t>(n), std::vector<Got>(size_t(kCalls)));
  std::vector<uint32_t> status(size_t(n), 0), word(size_t(n), 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cuda_ipc::IpcComm c = comm_for(arenas, r, kBigSlot);
      c.fused_bytes_per_block = 16 * 1024;                         // IpcComm's default
      c.fused_grid_blocks = cuda_ipc::fused_grid_blocks(132, n);  // the ranks share an H100
      c.host_replay_failure = &word[size_t(r)];
      std::vector<uint4> in_store(size_t(full) * sizeof(T) / 16 + 2), out_store(in_store.size());
      for (int k = 0; k < kCalls; ++k) {
        const int64_t count = counts[k];
        const bool in_place = k % 2 == 1;
        const int64_t off = k % 3 == 2 ? 1 : 0;
        T* in = reinterpret_cast<T*>(in_store.data()) + off;
        T* out = in_place ? in : reinterpret_cast<T*>(out_store.data()) + off;
        Got& g = got[size_t(r)][size_t(k)];
        for (int graphed = 0; graphed < 2; ++graphed) {
          std::this_thread::sleep_for(std::chrono::microseconds(300 * ((k + r + graphed) % 3)));
          for (int64_t i = 0; i < count; ++i) in[i] = value<T>(r, k, i);
          cuda_ipc::g_last_allreduce = {};
          const ReduceOp op = ReduceOp(k % 5);
          const cudaError_t err =
              graphed ? cuda_ipc::allreduce_graphed(c, dtype_of<T>(), op, in, out, count, nullptr)
              : cuda_ipc::prefer_one_shot(count * es, c)
                  ? cuda_ipc::allreduce_one_shot(c, dtype_of<T>(), op, in, out, count, nullptr)
                  : cuda_ipc::allreduce_two_shot(c, dtype_of<T>(), op, in, out, count, nullptr);
          expect(err == cudaSuccess, "graph shapes: the call was enqueued");
          (graphed ? g.graphed : g.eager) = cuda_ipc::g_last_allreduce;
          (graphed ? g.graphed_out : g.eager_out).assign(out, out + count);
        }
      }
      cuda_ipc::read_status(c, nullptr, &status[size_t(r)]);
    });
  }
  for (auto& t : threads) t.join();
  char what[240];
  using K = cuda_ipc::AllreduceKernel;
  auto name = [](K k) { return k == K::kOneShot ? "one-shot" : k == K::kTwoShot ? "two-shot" : "none"; };
  for (int r = 0; r < n; ++r) {
    std::snprintf(what, sizeof(what), "graph shapes %s n=%d: rank %d status %u, failure word %u",
                  dtype_name(dtype_of<T>()), n, r, status[size_t(r)], word[size_t(r)]);
    expect(status[size_t(r)] == 0 && word[size_t(r)] == 0, what);
    for (int k = 0; k < kCalls; ++k) {
      const Got& g = got[size_t(r)][size_t(k)];
      const int64_t count = counts[k];
      const K want = count * es <= cuda_ipc::default_one_shot_max_bytes(n) ? K::kOneShot : K::kTwoShot;
      std::snprintf(what, sizeof(what),
                    "graph shapes %s n=%d rank %d count %ld: eager %s x %d blocks, replay %s%s x %d blocks, want %s",
                    dtype_name(dtype_of<T>()), n, r, long(count), name(g.eager.kernel), g.eager.nblocks,
                    g.graphed.graphed ? "" : "(not graphed) ", name(g.graphed.kernel), g.graphed.nblocks, name(want));
      expect(g.eager.kernel == want && !g.eager.graphed && g.graphed.graphed && g.graphed.kernel == g.eager.kernel &&
                 g.graphed.nblocks == g.eager.nblocks,
             what);
      const std::vector<T> e = expected<T>(n, ReduceOp(k % 5), k, count);
      std::snprintf(what, sizeof(what), "graph shapes %s n=%d rank %d count %ld op %s: eager %s, replay %s",
                    dtype_name(dtype_of<T>()), n, r, long(count), op_name(ReduceOp(k % 5)),
                    std::memcmp(g.eager_out.data(), e.data(), e.size() * sizeof(T)) == 0 ? "equal" : "DIFFERS",
                    std::memcmp(g.graphed_out.data(), e.data(), e.size() * sizeof(T)) == 0 ? "equal" : "DIFFERS");
      expect(std::memcmp(g.eager_out.data(), e.data(), e.size() * sizeof(T)) == 0 &&
                 std::memcmp(g.graphed_out.data(), e.data(), e.size() * sizeof(T)) == 0,
             what);
    }
  }
  // The target: a replay of 8 MiB runs the eager call's two-shot grid.
  std::snprintf(what, sizeof(what), "graph shapes %s n=%d: an 8 MiB replay runs the two-shot on %d blocks",
                dtype_name(dtype_of<T>()), n, got[0][5].graphed.nblocks);
  expect(got[0][5].graphed.kernel == K::kTwoShot && got[0][5].graphed.nblocks == got[0][5].eager.nblocks &&
             got[0][5].graphed.nblocks > cuda_ipc::kFusedMaxBlocks,
         what);
}

// Ranks whose one-shot limits differ replay one size in two schedules (rank
// 0 the two-shot, the others the one-shot): every rank fails (kMismatch
// naming the two graphed schedules, or kPeerAborted) instead of reducing
// what the other schedule published, and its failure word holds the status.
// Left out under ThreadSanitizer: the two schedules cut the data differently
// (emulated_checks.h).
void check_graph_schedule_desync(int n) {
  Arenas arenas(n, kSlot);
  std::vector<Outcome> o(static_cast<size_t>(n));
  std::vector<uint32_t> word(size_t(n), 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cuda_ipc::IpcComm c = comm_for(arenas, r, kSlot);
      c.host_status = &o[size_t(r)].mirror;
      c.host_mismatch = &o[size_t(r)].record;
      c.host_replay_failure = &word[size_t(r)];
      std::vector<float> in(600, 1.0f);
      cuda_ipc::allreduce_graphed(c, DType::F32, ReduceOp::SUM, in.data(), in.data(), 600, nullptr,
                                  r == 0 ? 0 : -1);
      cuda_ipc::read_status(c, nullptr, &o[size_t(r)].status);
    });
  }
  for (auto& t : threads) t.join();
  char what[200];
  int mismatched = 0;
  for (int r = 0; r < n; ++r) {
    const Outcome& x = o[size_t(r)];
    std::snprintf(what, sizeof(what), "graph schedule desync n=%d: rank %d status %u, mirror %u, failure word %u", n,
                  r, x.status, x.mirror, word[size_t(r)]);
    expect((x.status == kMismatch || x.status == kAborted) && x.mirror == x.status && word[size_t(r)] == x.status,
           what);
    if (x.status != kMismatch) continue;
    ++mismatched;
    const int64_t mine = emulated::fused_aux(r == 0 ? kAuxGraphedTwoShot : kAuxGraphed);
    const int64_t theirs = emulated::fused_aux(r == 0 ? kAuxGraphed : kAuxGraphedTwoShot);
    std::snprintf(what, sizeof(what), "graph schedule desync n=%d: rank %d's record names the two schedules", n, r);
    expect(x.record.mine.aux == mine && x.record.theirs.aux == theirs, what);
  }
  std::snprintf(what, sizeof(what), "graph schedule desync n=%d: no rank reports the mismatch", n);
  expect(mismatched > 0, what);
}

}  // namespace

int main() {
  for (cuda_ipc::FlagForm form : emulated::kFlagForms) {
  emulated::g_flag_form = form;
  std::fprintf(stderr, "checks with %s\n", emulated::flag_form_name(form));
  for (int n = 2; n <= 4; ++n) check_graph_shapes<float>(n);
  check_graph_shapes<bf16>(2);
  if (!kThreadSanitizer)
    for (int n = 2; n <= 3; ++n) check_graph_schedule_desync(n);
  // Under ThreadSanitizer the ranks' orderings are what is checked, and 2, 3
  // and 4 ranks have every pairing the larger groups have; the address build
  // checks the layouts' index math up to 8.
  for (int n = 2; n <= (kThreadSanitizer ? 4 : 8); ++n) {
    check_layouts<float>(n);
    check_layouts<bf16>(n);
    check_layouts<int8_t>(n);
  }
  for (int round = 0; round < 3; ++round)
    for (int n = 2; n <= 4; ++n) {
      check_desync(n, false);
      check_desync(n, true);
    }
  check_lone_replay(false);
  check_lone_replay(true);
  check_misordered();
  check_missing_peer(false);
  check_missing_peer(true);
  }
  emulated::g_flag_form = cuda_ipc::FlagForm::kPollPeer;
  for (int n = 2; n <= 3; ++n)
    for (bool waiter0 : {false, true})
      for (bool graphed : {false, true})
        for (bool two_shot : {false, true}) check_form_mix(n, waiter0, graphed, two_shot);
  std::printf("%ld checks, %ld failures\n", long(checks.load()), long(failures.load()));
  return failures == 0 ? 0 : 1;
}
