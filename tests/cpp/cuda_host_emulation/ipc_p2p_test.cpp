// The CUDA IPC point-to-point schedules (core/executors/cuda_ipc/ipc_p2p.cpp) and
// the ring protocol of p2p_ring.h, run on the host: the very p2p_step the
// kernel runs, over host atomics, and one thread per rank and peer and
// direction standing for the backend's stream per peer and direction.
// Checked:
//   * every ordered pair of 2-4 ranks exchanges a run of messages at once
//     (sizes 0, 1, odd, one chunk, one chunk + 1, more chunks than the ring
//     holds, so the sender waits for credit), tags varying: every byte
//     arrives, in order, and nothing is written past a receive's buffer;
//   * a receive whose tag or size differs from the sender's next message
//     records kMismatch, aborts its rank and leaves its buffer unwritten;
//   * a receive from a peer that never sends, and a send blocked on a ring
//     nobody drains, give up when the host writes the host abort word (a
//     dead peer), long before the 20 s timeout, and a peer's control-block
//     abort ends a third rank's wait (kPeerAborted).
// Exit status 0 = every check passed.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "emulated_checks.h"
#include "emulated_ipc.h"
#include "emulated_p2p.h"

#include "csrc/core/executors/cuda_ipc/ipc_p2p.cpp"

using namespace fastpar;
using emulated::Arenas;
using emulated::comm_for;


namespace {

constexpr size_t kSlotBytes = 4096;
const int64_t kChunk = int64_t(cuda_ipc::kP2PChunkBytes);

unsigned char byte_of(int src, int dst, int msg, int64_t i) {
  return static_cast<unsigned char>((src * 31 + dst * 17 + msg * 7 + i * 13) & 0xff);
}

uint32_t status_word(const Arenas& a, int r) { return *cuda_ipc::status_of(a.bases[size_t(r)]); }

// Every ordered pair sends `sizes` in order, all pairs at once.
void check_exchange(int n) {
  const std::vector<int64_t> sizes = {0, 1, 1001, kChunk, kChunk + 1, 5 * kChunk + 3, 0, 9 * kChunk, 17};
  Arenas arenas(n, kSlotBytes);
  std::vector<std::thread> threads;
  std::atomic<int> bad_bytes{0}, bad_guard{0}, bad_rc{0};
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      threads.emplace_back([&, r, q] {  // r -> q
        cuda_ipc::IpcComm c = comm_for(arenas, r, kSlotBytes);
        for (size_t m = 0; m < sizes.size(); ++m) {
          std::vector<unsigned char> buf(static_cast<size_t>(sizes[m]));
          for (int64_t i = 0; i < sizes[m]; ++i) buf[size_t(i)] = byte_of(r, q, int(m), i);
          if (cuda_ipc::send_ipc(c, buf.data(), sizes[m], q, int64_t(m) * 3 + 1, nullptr) != cudaSuccess) ++bad_rc;
        }
      });
      threads.emplace_back([&, r, q] {  // r receives from q
        cuda_ipc::IpcComm c = comm_for(arenas, r, kSlotBytes);
        for (size_t m = 0; m < sizes.size(); ++m) {
          std::vector<unsigned char> buf(static_cast<size_t>(sizes[m]) + 16, 0xA5);
          if (cuda_ipc::recv_ipc(c, buf.data(), sizes[m], q, int64_t(m) * 3 + 1, nullptr) != cudaSuccess) ++bad_rc;
          for (int64_t i = 0; i < sizes[m]; ++i)
            if (buf[size_t(i)] != byte_of(q, r, int(m), i)) {
              ++bad_bytes;
              break;
            }
          for (size_t i = size_t(sizes[m]); i < buf.size(); ++i)
            if (buf[i] != 0xA5) ++bad_guard;
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  char what[160];
  std::snprintf(what, sizeof(what), "exchange n=%d: %d wrong messages, %d guard bytes written, %d launch errors", n,
                bad_bytes.load(), bad_guard.load(), bad_rc.load());
  expect(bad_bytes == 0 && bad_guard == 0 && bad_rc == 0, what);
  for (int r = 0; r < n; ++r) {
    std::snprintf(what, sizeof(what), "exchange n=%d: rank %d status %u", n, r, status_word(arenas, r));
    expect(status_word(arenas, r) == 0, what);
  }
}

// Rank 0 sends (tag 5, 100 bytes); rank 1 expects a different tag or size.
void check_mismatch(bool wrong_tag) {
  Arenas arenas(2, kSlotBytes);
  uint32_t mirror = 0;
  std::thread sender([&] {
    cuda_ipc::IpcComm c = comm_for(arenas, 0, kSlotBytes);
    std::vector<unsigned char> buf(100, 7);
    cuda_ipc::send_ipc(c, buf.data(), 100, 1, 5, nullptr);
  });
  std::vector<unsigned char> out(200, 0xA5);
  std::thread receiver([&] {
    cuda_ipc::IpcComm c = comm_for(arenas, 1, kSlotBytes);
    c.host_status = &mirror;
    cuda_ipc::recv_ipc(c, out.data(), wrong_tag ? 100 : 200, 0, wrong_tag ? 6 : 5, nullptr);
  });
  sender.join();
  receiver.join();
  bool untouched = true;
  for (unsigned char b : out) untouched = untouched && b == 0xA5;
  char what[160];
  std::snprintf(what, sizeof(what), "mismatch (%s): receiver status %u mirror %u, buffer untouched %d",
                wrong_tag ? "tag" : "size", status_word(arenas, 1), mirror, int(untouched));
  expect(status_word(arenas, 1) == uint32_t(flags::WaitStatus::kMismatch) && mirror == status_word(arenas, 1) &&
             untouched,
         what);
  std::snprintf(what, sizeof(what), "mismatch (%s): receiver's control block aborted",
                wrong_tag ? "tag" : "size");
  expect(__atomic_load_n(&cuda_ipc::control_of(arenas.bases[1])->abort, __ATOMIC_ACQUIRE) != 0, what);
}

// Rank 2 never sends to rank 0 (a dead process); rank 0 waits for it and
// also sends rank 2 more chunks than the ring holds. Rank 0's host raises the
// host abort word; rank 1, waiting for a message from rank 0, ends through
// rank 0's control-block abort.
void check_dead_peer() {
  Arenas arenas(3, kSlotBytes);
  uint64_t host_abort0 = 0;
  const auto t0 = std::chrono::steady_clock::now();
  std::thread recv0([&] {
    cuda_ipc::IpcComm c = comm_for(arenas, 0, kSlotBytes);
    c.host_abort = &host_abort0;
    std::vector<unsigned char> buf(64);
    cuda_ipc::recv_ipc(c, buf.data(), 64, 2, 0, nullptr);
  });
  std::thread send0([&] {
    cuda_ipc::IpcComm c = comm_for(arenas, 0, kSlotBytes);
    c.host_abort = &host_abort0;
    std::vector<unsigned char> buf(size_t(6 * kChunk));
    cuda_ipc::send_ipc(c, buf.data(), int64_t(buf.size()), 2, 0, nullptr);
  });
  std::thread recv1([&] {
    cuda_ipc::IpcComm c = comm_for(arenas, 1, kSlotBytes);
    std::vector<unsigned char> buf(64);
    cuda_ipc::recv_ipc(c, buf.data(), 64, 0, 0, nullptr);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  __atomic_store_n(&host_abort0, uint64_t(flags::WaitStatus::kPeerDead), __ATOMIC_RELEASE);
  recv0.join();
  send0.join();
  recv1.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char what[160];
  std::snprintf(what, sizeof(what), "dead peer: survivors took %.2f s (timeout 20 s)", secs);
  expect(secs < 5.0, what);
  std::snprintf(what, sizeof(what), "dead peer: rank 0 status %u, rank 1 status %u", status_word(arenas, 0),
                status_word(arenas, 1));
  expect(status_word(arenas, 0) == uint32_t(flags::WaitStatus::kPeerDead) &&
             status_word(arenas, 1) == uint32_t(flags::WaitStatus::kPeerAborted),
         what);
}

// A send to oneself or to a rank outside the group is refused before any step.
void check_bad_peer() {
  Arenas arenas(2, kSlotBytes);
  cuda_ipc::IpcComm c = comm_for(arenas, 0, kSlotBytes);
  unsigned char b = 0;
  expect(cuda_ipc::send_ipc(c, &b, 1, 0, 0, nullptr) == cudaErrorInvalidValue, "send to self refused");
  expect(cuda_ipc::recv_ipc(c, &b, 1, 2, 0, nullptr) == cudaErrorInvalidValue, "recv from rank 2 of 2 refused");
  expect(cuda_ipc::send_ipc(c, &b, -1, 1, 0, nullptr) == cudaErrorInvalidValue, "negative size refused");
  expect(c.p2p_sent[1] == 0 && c.p2p_received[1] == 0, "refused calls count no chunks");
}

}  // namespace

int main() {
  cuda_kernels::g_blocks = 2;
  cuda_kernels::g_threads = 3;
  for (int n = 2; n <= 4; ++n) check_exchange(n);
  check_mismatch(true);
  check_mismatch(false);
  check_dead_peer();
  check_bad_peer();
  std::printf("%ld checks, %ld failures\n", long(checks.load()), long(failures.load()));
  return failures == 0 ? 0 : 1;
}
