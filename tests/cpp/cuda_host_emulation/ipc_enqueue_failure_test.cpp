// A CUDA IPC call whose k-th launch fails (ipc_steps.h, fail_enqueue), run on
// the host with one thread per rank: the fake runtime refuses the k-th launch
// of a thread as a real launch does (through cudaGetLastError, the kernel
// never running). Every k of the call is tried, for the two-shot (several
// chunks), the fused one-shot, the three-launch one-shot and send/recv (on the
// sender and on the receiver). Checked:
//   * the failing call returns the launch's error; the rank's communicator
//     keeps it (enqueue_error) and refuses every later call with it before
//     enqueueing anything or counting a phase, round or chunk;
//   * its host abort word is raised and its control block's abort word is
//     written, so that every peer's call ends with kPeerAborted long before
//     the 20 s flag-wait timeout, whether the rank had posted some of the
//     call's phases or none, and even with none of its kernels queued (the
//     emulation runs each one as it is enqueued);
//   * an error left on the thread by other code (not sticky) before a call
//     does not make the call's first launch look failed: every call still
//     succeeds, with the right bits.
// Exit status 0 = every check passed.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "emulated_checks.h"
#include "emulated_ipc.h"
#include "emulated_p2p.h"

#include "csrc/core/executors/cuda_ipc/ipc_allreduce.cpp"
#include "csrc/core/executors/cuda_ipc/ipc_p2p.cpp"

using namespace fastpar;
using emulated::Arenas;
using emulated::comm_for;


namespace {

constexpr cudaError_t kRefused = cudaErrorLaunchOutOfResources;
const uint32_t kAborted = uint32_t(flags::WaitStatus::kPeerAborted);

// kTwoShot: the step-by-step two-shot (a launch per step); kFusedTwoShot: its one-kernel form.
enum class Sched { kTwoShot, kFused, kUnfused, kFusedTwoShot };
const char* sched_name(Sched s) {
  return s == Sched::kTwoShot         ? "two-shot"
         : s == Sched::kFused         ? "fused one-shot"
         : s == Sched::kFusedTwoShot  ? "fused two-shot"
                                      : "three-launch one-shot";
}

// Small integers: every sum is exact in float32, whatever the order.
float value(int rank, int call, int64_t i) { return float((rank * 5 + call * 3 + i * 7) % 11); }

// One rank's communicator with its own host words (as IpcEndpoint gives it).
struct Rank {
  cuda_ipc::IpcComm c;
  uint64_t abort_word = 0;
  uint32_t mirror = 0;
  Rank(const Arenas& a, int r, size_t slot_bytes, Sched s) : c(comm_for(a, r, slot_bytes)) {
    c.fused_one_shot = s == Sched::kFused;
    c.fused_two_shot = s == Sched::kFusedTwoShot;
    c.host_abort = &abort_word;
    c.host_abort_host = &abort_word;
    c.host_status = &mirror;
  }
};

cudaError_t allreduce(cuda_ipc::IpcComm& c, Sched s, std::vector<float>& buf) {
  const int64_t n = int64_t(buf.size());
  return s == Sched::kTwoShot || s == Sched::kFusedTwoShot ? cuda_ipc::allreduce_two_shot(c, DType::F32, ReduceOp::SUM, buf.data(), buf.data(), n, nullptr)
                              : cuda_ipc::allreduce_one_shot(c, DType::F32, ReduceOp::SUM, buf.data(), buf.data(), n, nullptr);
}

bool right_sums(const std::vector<float>& buf, int n, int call) {
  for (size_t i = 0; i < buf.size(); ++i) {
    float want = 0;
    for (int q = 0; q < n; ++q) want += value(q, call, int64_t(i));
    if (buf[i] != want) return false;
  }
  return true;
}

// Launches rank `bad` makes in call 1 when nothing fails (k = 0), or the run
// with its k-th launch of call 1 refused. Three calls; an error some other
// code left on the thread precedes each.
int64_t run_allreduce(int n, Sched s, int64_t count, size_t slot_bytes, int bad, int64_t k) {
  Arenas arenas(n, slot_bytes);
  std::vector<cudaError_t> errs(size_t(n) * 3, cudaSuccess);
  std::vector<int> right(size_t(n) * 3, 0);
  std::atomic<int64_t> launches_in_call1{0};
  int64_t launches_after = -1;
  uint64_t seq_before = 0, seq_after = 0, rounds_before = 0, rounds_after = 0;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Rank rank(arenas, r, slot_bytes, s);
      fake_cuda::launches = 0;
      fake_cuda::fail_launch_at = 0;
      for (int call = 0; call < 3; ++call) {
        std::vector<float> buf(static_cast<size_t>(count));
        for (int64_t i = 0; i < count; ++i) buf[size_t(i)] = value(r, call, i);
        const int64_t before = fake_cuda::launches;
        if (r == bad && call == 1 && k > 0) fake_cuda::fail_launch_at = before + k;
        if (r == bad && call == 2) {
          seq_before = rank.c.seq;
          rounds_before = rank.c.rounds;
        }
        fake_cuda::last_error = cudaErrorInvalidValue;  // stale: not this call's
        errs[size_t(r * 3 + call)] = allreduce(rank.c, s, buf);
        right[size_t(r * 3 + call)] = right_sums(buf, n, call);
        if (r == bad && call == 1) launches_in_call1 = fake_cuda::launches - before;
        if (r == bad && call == 2) {
          launches_after = fake_cuda::launches - before;
          seq_after = rank.c.seq;
          rounds_after = rank.c.rounds;
        }
      }
      uint32_t status = 0;
      cuda_ipc::read_status(rank.c, nullptr, &status);
      if (r == bad) {
        char what[200];
        std::snprintf(what, sizeof(what), "%s n=%d k=%ld: rank %d enqueue_error %d abort word %lu", sched_name(s), n,
                      long(k), r, int(rank.c.enqueue_error), (unsigned long)rank.abort_word);
        expect(k == 0 ? rank.c.enqueue_error == cudaSuccess && rank.abort_word == 0
                      : rank.c.enqueue_error == kRefused && rank.abort_word == kAborted,
               what);
      }
      if (r != bad || k == 0) {
        char what[200];
        std::snprintf(what, sizeof(what), "%s n=%d k=%ld: rank %d status %u", sched_name(s), n, long(k), r, status);
        expect(k == 0 ? status == 0 : status == kAborted, what);
      }
    });
  }
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char what[200];
  std::snprintf(what, sizeof(what), "%s n=%d k=%ld: %.2f s (flag-wait timeout 20 s)", sched_name(s), n, long(k), secs);
  expect(secs < 5.0, what);
  if (k == 0) {
    for (size_t i = 0; i < errs.size(); ++i) {
      std::snprintf(what, sizeof(what), "%s n=%d: rank %zu call %zu: error %d, right %d despite a stale error",
                    sched_name(s), n, i / 3, i % 3, int(errs[i]), right[i]);
      expect(errs[i] == cudaSuccess && right[i], what);
    }
    return launches_in_call1;
  }
  std::snprintf(what, sizeof(what), "%s n=%d k=%ld: failing call returned %d, later call %d", sched_name(s), n,
                long(k), int(errs[size_t(bad * 3 + 1)]), int(errs[size_t(bad * 3 + 2)]));
  expect(errs[size_t(bad * 3 + 1)] == kRefused && errs[size_t(bad * 3 + 2)] == kRefused, what);
  std::snprintf(what, sizeof(what), "%s n=%d k=%ld: the refused call launched %ld, seq %lu -> %lu, rounds %lu -> %lu",
                sched_name(s), n, long(k), long(launches_after), (unsigned long)seq_before, (unsigned long)seq_after,
                (unsigned long)rounds_before, (unsigned long)rounds_after);
  expect(launches_after == 0 && seq_after == seq_before && rounds_after == rounds_before, what);
  std::snprintf(what, sizeof(what), "%s n=%d k=%ld: control-block abort of the failed rank", sched_name(s), n, long(k));
  expect(__atomic_load_n(&cuda_ipc::control_of(arenas.bases[size_t(bad)])->abort, __ATOMIC_ACQUIRE) != 0, what);
  // A peer may still be finishing call 0 when the abort lands (the protocol
  // fails a wait on an aborted peer even if its flag is there): its bits are
  // not checked, only that enqueueing never failed on a healthy rank.
  for (int r = 0; r < n; ++r) {
    std::snprintf(what, sizeof(what), "%s n=%d k=%ld: rank %d enqueued every call", sched_name(s), n, long(k), r);
    expect(r == bad || (errs[size_t(r * 3)] == cudaSuccess && errs[size_t(r * 3 + 1)] == cudaSuccess &&
                        errs[size_t(r * 3 + 2)] == cudaSuccess),
           what);
  }
  std::snprintf(what, sizeof(what), "%s n=%d k=%ld: rank %d call 0 right", sched_name(s), n, long(k), bad);
  expect(errs[size_t(bad * 3)] == cudaSuccess && right[size_t(bad * 3)], what);
  return launches_in_call1;
}

void check_allreduce(int n, Sched s, int64_t count, size_t slot_bytes) {
  const int bad = n - 1;
  const int64_t launches = run_allreduce(n, s, count, slot_bytes, bad, 0);
  char what[160];
  std::snprintf(what, sizeof(what), "%s n=%d: %ld launches per call", sched_name(s), n, long(launches));
  expect(s == Sched::kFused || s == Sched::kFusedTwoShot ? launches == 1
         : s == Sched::kUnfused                          ? launches == 3
                                                         : launches > 3,
         what);
  for (int64_t k = 1; k <= launches; ++k) run_allreduce(n, s, count, slot_bytes, bad, k);
}

// Rank 0 sends rank 1 three messages of `chunks` ring chunks each; the k-th
// launch of message 1 fails on the sender or on the receiver (k = 0: none).
// More chunks than the ring holds, so a sender also waits for credit.
int64_t run_p2p(bool fail_sender, int64_t chunks, int64_t k) {
  const size_t slot_bytes = 4096;
  const int64_t bytes = chunks * int64_t(cuda_ipc::kP2PChunkBytes) - 5;
  Arenas arenas(2, slot_bytes);
  std::vector<cudaError_t> errs(6, cudaSuccess);
  std::atomic<int64_t> launches_in_msg1{0};
  int64_t launches_after = -1;
  uint32_t status[2] = {0, 0};
  int received_right = 0;
  const int bad = fail_sender ? 0 : 1;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      Rank rank(arenas, r, slot_bytes, Sched::kTwoShot);
      fake_cuda::launches = 0;
      fake_cuda::fail_launch_at = 0;
      for (int m = 0; m < 3; ++m) {
        std::vector<unsigned char> buf(size_t(bytes), 0);
        if (r == 0)
          for (int64_t i = 0; i < bytes; ++i) buf[size_t(i)] = static_cast<unsigned char>((i * 13 + m) & 0xff);
        const int64_t before = fake_cuda::launches;
        if (r == bad && m == 1 && k > 0) fake_cuda::fail_launch_at = before + k;
        fake_cuda::last_error = cudaErrorInvalidValue;  // stale: not this call's
        errs[size_t(r * 3 + m)] = r == 0 ? cuda_ipc::send_ipc(rank.c, buf.data(), bytes, 1, m, nullptr)
                                         : cuda_ipc::recv_ipc(rank.c, buf.data(), bytes, 0, m, nullptr);
        if (r == bad && m == 1) launches_in_msg1 = fake_cuda::launches - before;
        if (r == bad && m == 2) launches_after = fake_cuda::launches - before;
        if (r == 1 && m == 0) {
          bool ok = true;
          for (int64_t i = 0; i < bytes; ++i) ok = ok && buf[size_t(i)] == static_cast<unsigned char>((i * 13) & 0xff);
          received_right = ok;
        }
      }
      cuda_ipc::read_status(rank.c, nullptr, &status[r]);
    });
  }
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const char* who = fail_sender ? "sender" : "receiver";
  char what[200];
  std::snprintf(what, sizeof(what), "p2p %s k=%ld: %.2f s (flag-wait timeout 20 s)", who, long(k), secs);
  expect(secs < 5.0, what);
  std::snprintf(what, sizeof(what), "p2p %s k=%ld: message 0 arrived", who, long(k));
  expect(received_right && errs[0] == cudaSuccess && errs[3] == cudaSuccess, what);
  if (k == 0) {
    std::snprintf(what, sizeof(what), "p2p: every call succeeds despite a stale error (statuses %u %u)", status[0],
                  status[1]);
    bool ok = status[0] == 0 && status[1] == 0;
    for (cudaError_t e : errs) ok = ok && e == cudaSuccess;
    expect(ok, what);
    return launches_in_msg1;
  }
  std::snprintf(what, sizeof(what), "p2p %s k=%ld: failing call %d, later call %d launching %ld", who, long(k),
                int(errs[size_t(bad * 3 + 1)]), int(errs[size_t(bad * 3 + 2)]), long(launches_after));
  expect(errs[size_t(bad * 3 + 1)] == kRefused && errs[size_t(bad * 3 + 2)] == kRefused && launches_after == 0, what);
  std::snprintf(what, sizeof(what), "p2p %s k=%ld: the peer's status %u", who, long(k), status[1 - bad]);
  expect(status[1 - bad] == kAborted, what);
  return launches_in_msg1;
}

void check_p2p(bool fail_sender) {
  const int64_t chunks = cuda_ipc::kP2PChunks + 2;
  const int64_t launches = run_p2p(fail_sender, chunks, 0);
  char what[120];
  std::snprintf(what, sizeof(what), "p2p: %ld launches per message of %ld chunks", long(launches), long(chunks));
  expect(launches == 2 * chunks + chunks, what);  // two steps and one copy per chunk
  for (int64_t k = 1; k <= launches; ++k) run_p2p(fail_sender, chunks, k);
}

}  // namespace

int main() {
  cuda_kernels::g_blocks = 2;
  cuda_kernels::g_threads = 3;
  for (int n = 2; n <= 3; ++n) {
    check_allreduce(n, Sched::kTwoShot, 1000, 512);  // 4000 bytes: several chunks
    check_allreduce(n, Sched::kFusedTwoShot, 1000, 512);
    check_allreduce(n, Sched::kFused, 100, 512);
    check_allreduce(n, Sched::kUnfused, 100, 512);
  }
  check_p2p(true);
  check_p2p(false);
  std::printf("%ld checks, %ld failures\n", long(checks.load()), long(failures.load()));
  return failures == 0 ? 0 : 1;
}
