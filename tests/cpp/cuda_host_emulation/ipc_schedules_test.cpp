// The CUDA IPC allreduce schedules (core/executors/cuda_ipc/ipc_allreduce.cpp) run
// on the host: one thread per rank stands for one process, the arenas are
// plain host memory every thread can read (as IPC mappings are), the phase
// step is the same flag protocol (core/transport/flag_protocol.h) over host
// atomics, and the reduce kernel is emulated (emulated_launchers.h). Checked:
//   * every rank's output equals the in-order reduction bit for bit, for
//     one-shot and two-shot, in and out of place, single- and multi-chunk
//     messages, in one long sequence of calls (slot and descriptor rotation);
//   * ranks that disagree on the call fail with kMismatch on every rank and
//     do not hang, a failed rank's later kernels leave outputs untouched,
//     and the failure reaches the host-mapped status mirror;
//   * one-shot calls that fit a slot run as the fused kernel (ipc_fused_one_shot.h:
//     per-block flags, descriptor on block 0, blocks at once: emulated_ipc.h),
//     two-shot calls as the fused two-shot kernel (ipc_fused_two_shot.h), and
//     the step-by-step schedules (fused_one_shot = fused_two_shot = false)
//     still pass the same checks;
//   * the graphed all_reduce (what CUDA graph capture records) replayed with
//     the very same arguments: every replay a new call with the right bits,
//     sizes (so block counts) changing between calls, eager calls in between,
//     the eager phase numbering untouched, the replays' failure word left at
//     0; a desynced replay fails on every rank and leaves its status in the
//     failure word; a call larger than a slot is refused before anything
//     runs. ipc_fused_test.cpp checks the fused kernels' layouts, dtypes,
//     first-failure-wins and the failure word in depth.
// Exit status 0 = every check passed.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "emulated_checks.h"
#include "emulated_ipc.h"
#include "csrc/core/kernels/cpu_reduce.h"
#include "csrc/core/transport/registered_arena.h"

#include "csrc/core/executors/cuda_ipc/ipc_allreduce.cpp"

using namespace fastpar;

namespace {

using emulated::Arenas;
using emulated::comm_for;

float value(int rank, int call, int64_t i) { return float((rank * 7 + call * 3 + i * 5) % 17) - 8.0f + 0.25f * float(rank); }

// One call of the sequence: dtype float16 for odd calls (fp32 accumulation), float32 otherwise.
struct Call {
  bool two_shot;
  bool in_place;
  int64_t count;
  ReduceOp op;
};

template <typename T>
T from_float(float f) {
  if constexpr (std::is_same_v<T, f16>) return to_f16(f);
  else return T(f);
}

template <typename T>
void run_call(cuda_ipc::IpcComm& c, const Call& call, int index, std::vector<T>& out_all) {
  std::vector<uint4> in_store(size_t(call.count) * sizeof(T) / 16 + 2), out_store(in_store.size());
  T* in = reinterpret_cast<T*>(in_store.data());
  T* out = call.in_place ? in : reinterpret_cast<T*>(out_store.data());
  for (int64_t i = 0; i < call.count; ++i) in[i] = from_float<T>(value(c.rank, index, i));
  const DType dt = std::is_same_v<T, f16> ? DType::F16 : DType::F32;
  const cudaError_t err = call.two_shot ? cuda_ipc::allreduce_two_shot(c, dt, call.op, in, out, call.count, nullptr)
                                        : cuda_ipc::allreduce_one_shot(c, dt, call.op, in, out, call.count, nullptr);
  expect(err == cudaSuccess, "schedule returned an error");
  out_all.assign(out, out + call.count);
}

template <typename T>
std::vector<T> expected(int n, const Call& call, int index) {
  std::vector<std::vector<T>> ins(size_t(n), std::vector<T>(size_t(call.count)));
  std::vector<const T*> srcs;
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < call.count; ++i) ins[size_t(r)][size_t(i)] = from_float<T>(value(r, index, i));
    srcs.push_back(ins[size_t(r)].data());
  }
  std::vector<T> out(size_t(call.count));
  T* d = out.data();
  FASTPAR_DISPATCH_OP(call.op, [&] {
    cpu_reduce_range<T, kOp>(srcs.data(), n, &d, 1, 0, call.count, n);
  });
  return out;
}

void check_sequence(int n, size_t slot_bytes) {
  std::vector<Call> calls;
  std::mt19937 rng(unsigned(n * 1000 + slot_bytes));
  for (int i = 0; i < 40; ++i) {
    const int64_t sizes[] = {1, 3, 17, 64, 100, 1000, 5000};
    calls.push_back({bool(rng() % 2), bool(rng() % 2), sizes[rng() % 7], ReduceOp(rng() % 5)});
  }
  Arenas arenas(n, slot_bytes);
  std::vector<std::vector<std::vector<float>>> got32(static_cast<size_t>(n));
  std::vector<std::vector<std::vector<f16>>> got16(static_cast<size_t>(n));
  std::vector<uint32_t> status(size_t(n), 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cuda_ipc::IpcComm c = comm_for(arenas, r, slot_bytes);
      for (size_t i = 0; i < calls.size(); ++i) {
        if (i % 2) {
          got16[size_t(r)].emplace_back();
          run_call<f16>(c, calls[i], int(i), got16[size_t(r)].back());
        } else {
          got32[size_t(r)].emplace_back();
          run_call<float>(c, calls[i], int(i), got32[size_t(r)].back());
        }
      }
      cuda_ipc::read_status(c, nullptr, &status[size_t(r)]);
    });
  }
  for (auto& t : threads) t.join();
  char what[160];
  for (int r = 0; r < n; ++r) {
    std::snprintf(what, sizeof(what), "status of rank %d (n=%d slot=%zu) is %u", r, n, slot_bytes, status[size_t(r)]);
    expect(status[size_t(r)] == 0, what);
    for (size_t i = 0; i < calls.size(); ++i) {
      std::snprintf(what, sizeof(what), "call %zu (%s, %s, count %ld, op %s) rank %d n=%d slot=%zu", i,
                    calls[i].two_shot ? "two-shot" : "one-shot", calls[i].in_place ? "in place" : "out of place",
                    long(calls[i].count), op_name(calls[i].op), r, n, slot_bytes);
      if (i % 2) {
        const auto e = expected<f16>(n, calls[i], int(i));
        expect(std::memcmp(got16[size_t(r)][i / 2].data(), e.data(), e.size() * sizeof(f16)) == 0, what);
      } else {
        const auto e = expected<float>(n, calls[i], int(i));
        expect(std::memcmp(got32[size_t(r)][i / 2].data(), e.data(), e.size() * sizeof(float)) == 0, what);
      }
    }
  }
}

// Rank 0 runs one-shot while the others run two-shot: every rank must see the
// disagreement (kMismatch, or kPeerAborted once a peer gave up) and return;
// the outputs of the failed calls stay as the caller left them.
// What a rank's kernel left for its host's message: a rank that saw the
// mismatch names a peer and both calls (its own with schedule `aux`); a rank
// that was only aborted names none.
void check_record(const cuda_ipc::MismatchRecord& m, flags::WaitStatus s, int r, int n, int64_t aux,
                  const char* test) {
  char what[160];
  const int peer = int(m.peer_plus_one) - 1;
  if (s == flags::WaitStatus::kMismatch) {
    std::snprintf(what, sizeof(what), "%s: rank %d of %d records peer %d and two different calls", test, r, n, peer);
    expect(peer >= 0 && peer < n && peer != r && !flags::same_call(m.mine, m.theirs), what);
    std::snprintf(what, sizeof(what), "%s: rank %d of %d records its own allreduce schedule", test, r, n);
    expect(m.mine.op == int32_t(Coll::kAllreduce) && m.mine.aux == aux, what);
  } else {
    std::snprintf(what, sizeof(what), "%s: rank %d of %d was aborted but records a mismatch", test, r, n);
    expect(m.peer_plus_one == 0, what);
  }
}

void check_mismatch(int n) {
  const size_t slot_bytes = 4096;
  // Under ThreadSanitizer the others' two-shot runs step by step beside rank
  // 0's fused one-shot: the two fused kernels cut the data into different
  // block ranges (emulated_checks.h).
  const bool fused_two_shot = emulated::g_fused_two_shot && !(kThreadSanitizer && emulated::g_fused_one_shot);
  Arenas arenas(n, slot_bytes);
  std::vector<uint32_t> status(size_t(n), 0);
  std::vector<int> untouched(size_t(n), 0);
  std::vector<uint32_t> mirror(size_t(n), 0);  // the host-mapped copy the c10d backend polls
  std::vector<cuda_ipc::MismatchRecord> record(size_t(n), cuda_ipc::MismatchRecord{});
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cuda_ipc::IpcComm c = comm_for(arenas, r, slot_bytes);
      c.fused_two_shot = fused_two_shot;
      c.timeout_ns = 2ull * 1000 * 1000 * 1000;
      c.host_status = &mirror[size_t(r)];
      c.host_mismatch = &record[size_t(r)];
      std::vector<float> in(100, 1.0f), out(100, -7.0f);
      if (r == 0) {
        cuda_ipc::allreduce_one_shot(c, DType::F32, ReduceOp::SUM, in.data(), out.data(), 100, nullptr);
      } else {
        cuda_ipc::allreduce_two_shot(c, DType::F32, ReduceOp::SUM, in.data(), out.data(), 100, nullptr);
      }
      // A later call on a failed communicator does nothing at all.
      std::vector<float> out2(100, -7.0f);
      cuda_ipc::allreduce_one_shot(c, DType::F32, ReduceOp::SUM, in.data(), out2.data(), 100, nullptr);
      cuda_ipc::read_status(c, nullptr, &status[size_t(r)]);
      untouched[size_t(r)] = std::all_of(out2.begin(), out2.end(), [](float v) { return v == -7.0f; });
    });
  }
  for (auto& t : threads) t.join();
  char what[160];
  for (int r = 0; r < n; ++r) {
    const auto s = flags::WaitStatus(status[size_t(r)]);
    std::snprintf(what, sizeof(what), "mismatch: rank %d of %d ended with status %u", r, n, status[size_t(r)]);
    expect(s == flags::WaitStatus::kMismatch || s == flags::WaitStatus::kPeerAborted, what);
    std::snprintf(what, sizeof(what), "mismatch: rank %d of %d wrote the output of a call after failing", r, n);
    expect(untouched[size_t(r)] != 0, what);
    std::snprintf(what, sizeof(what), "mismatch: rank %d of %d host status mirror %u != status %u", r, n,
                  mirror[size_t(r)], status[size_t(r)]);
    expect(mirror[size_t(r)] == status[size_t(r)], what);
    check_record(record[size_t(r)], s, r, n,
                 r != 0 ? (fused_two_shot ? kAuxFusedTwoShot : kAuxTwoShot)
                        : emulated::g_fused_one_shot ? kAuxFused : kAuxOneShot,
                 "mismatch");
  }
}

// Registered buffers: every rank allocates the same sequence of buffers in
// its registered region (RegisteredArena, as the c10d backend does), agrees
// on each (agree_registered_ipc), writes its data where the peers read it and
// runs the zero-copy two-shot in place; checked bit for bit against the
// in-order reduction, with slots small enough that a buffer spans several
// chunks. Then ranks whose offsets differ fail (kMismatch or kPeerAborted),
// and an arena every rank has outgrown agrees (the caller raises, the
// communicator stays usable).
void check_registered(int n, size_t slot_bytes) {
  const size_t reg_bytes = 64 * 1024;
  Arenas arenas(n, slot_bytes, reg_bytes);
  const int64_t counts[] = {1, 17, 100, 1000, 5000};
  std::vector<std::vector<std::vector<float>>> got(static_cast<size_t>(n));
  std::vector<uint32_t> status(size_t(n), 0), after_desync(size_t(n), 0);
  std::vector<int> refused(size_t(n), 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cuda_ipc::IpcComm c = comm_for(arenas, r, slot_bytes);
      RegisteredArena reg{int64_t(reg_bytes)};
      char* mine = cuda_ipc::registered_of(c.bases[r], c.slot_bytes);
      int index = 0;
      for (int64_t count : counts) {
        const int64_t off = reg.alloc(count * int64_t(sizeof(float)));
        expect(cuda_ipc::agree_registered_ipc(c, count * int64_t(sizeof(float)), off, nullptr) == cudaSuccess,
               "registered: the agreement was enqueued");
        float* buf = reinterpret_cast<float*>(mine + off);
        for (int64_t i = 0; i < count; ++i) buf[i] = value(r, 100 + index, i);
        const ReduceOp op = ReduceOp(index % 5);
        expect(cuda_ipc::allreduce_registered(c, DType::F32, op, off, count, nullptr) == cudaSuccess,
               "registered: the schedule was enqueued");
        got[size_t(r)].emplace_back(buf, buf + count);
        if (index % 2) reg.free(off);  // freed and reused in the same order on every rank
        ++index;
      }
      // Nothing fits on any rank: the agreement passes (the same descriptor).
      expect(reg.alloc(int64_t(reg_bytes) + 1) < 0, "registered: an oversized buffer does not fit");
      cuda_ipc::agree_registered_ipc(c, int64_t(reg_bytes) + 1, -1, nullptr);
      cuda_ipc::read_status(c, nullptr, &status[size_t(r)]);
      expect(cuda_ipc::allreduce_registered(c, DType::F32, ReduceOp::SUM, int64_t(reg_bytes) - 4, 2, nullptr) ==
                 cudaErrorInvalidValue,
             "registered: a buffer past the region is refused");
      refused[size_t(r)] = 1;
      c.timeout_ns = 2ull * 1000 * 1000 * 1000;
      cuda_ipc::allreduce_registered(c, DType::F32, ReduceOp::SUM, r == 0 ? 0 : 256, 16, nullptr);
      cuda_ipc::read_status(c, nullptr, &after_desync[size_t(r)]);
    });
  }
  for (auto& t : threads) t.join();
  char what[160];
  for (int r = 0; r < n; ++r) {
    std::snprintf(what, sizeof(what), "registered: rank %d of %d (slot %zu) status %u", r, n, slot_bytes,
                  status[size_t(r)]);
    expect(status[size_t(r)] == 0, what);
    for (size_t i = 0; i < std::size(counts); ++i) {
      const Call call{true, true, counts[i], ReduceOp(i % 5)};
      const auto e = expected<float>(n, call, 100 + int(i));
      std::snprintf(what, sizeof(what), "registered: rank %d of %d (slot %zu) buffer %zu of %ld", r, n, slot_bytes, i,
                    long(counts[i]));
      expect(got[size_t(r)][i].size() == e.size() &&
                 std::memcmp(got[size_t(r)][i].data(), e.data(), e.size() * sizeof(float)) == 0,
             what);
    }
    const auto s = flags::WaitStatus(after_desync[size_t(r)]);
    std::snprintf(what, sizeof(what), "registered: rank %d of %d with another offset ended with status %u", r, n,
                  after_desync[size_t(r)]);
    expect(n == 1 || s == flags::WaitStatus::kMismatch || s == flags::WaitStatus::kPeerAborted, what);
  }
}

// A registered all_reduce with rank 0 step by step and its peers pushing in
// one kernel (fused_two_shot): every rank fails (kMismatch, or kPeerAborted
// from a rank that saw it) within the 2 s timeout instead of waiting on
// flags the other form never posts; rank 0's record names both forms.
void check_registered_mix(int n) {
  const size_t slot_bytes = 4096, reg_bytes = 4096;
  Arenas arenas(n, slot_bytes, reg_bytes);
  std::vector<uint32_t> status(size_t(n), 0);
  std::vector<cuda_ipc::MismatchRecord> record(size_t(n), cuda_ipc::MismatchRecord{});
  std::vector<std::thread> threads;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cuda_ipc::IpcComm c = comm_for(arenas, r, slot_bytes);
      c.fused_two_shot = r != 0;
      c.timeout_ns = 2ull * 1000 * 1000 * 1000;
      c.host_mismatch = &record[size_t(r)];
      cuda_ipc::allreduce_registered(c, DType::F32, ReduceOp::SUM, 0, 64, nullptr);
      cuda_ipc::read_status(c, nullptr, &status[size_t(r)]);
    });
  }
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char what[160];
  for (int r = 0; r < n; ++r) {
    const auto s = flags::WaitStatus(status[size_t(r)]);
    std::snprintf(what, sizeof(what), "registered mix: rank %d of %d ended with status %u", r, n, status[size_t(r)]);
    expect(s == flags::WaitStatus::kMismatch || s == flags::WaitStatus::kPeerAborted, what);
  }
  std::snprintf(what, sizeof(what), "registered mix n=%d: failed in %.2f s (timeout 2 s)", n, secs);
  expect(secs < 1.5, what);
  if (flags::WaitStatus(status[0]) == flags::WaitStatus::kMismatch)
    expect(describe(record[0].theirs).find("schedule=fused, registered offset=0") != std::string::npos,
           "registered mix: rank 0's record names the peer's fused form");
}

// The graphed all_reduce as a CUDA graph replays it: per rank one `in` and
// one `out` buffer (the addresses fixed at capture), refilled before each
// call; calls of several sizes (several captured graphs), an eager one-shot
// call after every third, all checked bit for bit against the in-order
// reduction.
void check_graphed(int n) {
  const size_t slot_bytes = 4096;
  const int64_t sizes[] = {1, 17, 100, 1000, 64, 1000, 3, 1024};  // floats; 1024 fills the slot
  Arenas arenas(n, slot_bytes);
  std::vector<std::vector<std::vector<float>>> got(static_cast<size_t>(n));
  std::vector<uint32_t> status(size_t(n), 0), word(size_t(n), 0);
  std::vector<int> seq_untouched(size_t(n), 1), too_big_refused(size_t(n), 0);
  std::vector<std::thread> threads;
  const int calls = 24;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cuda_ipc::IpcComm c = comm_for(arenas, r, slot_bytes);
      c.host_replay_failure = &word[size_t(r)];
      std::vector<float> in(1024), out(1024), eager(64);
      for (int i = 0; i < calls; ++i) {
        const Call call{false, i % 2 == 0, sizes[i % 8], ReduceOp(i % 5)};
        // Ranks drift apart by up to a call (a replay has one barrier, so a
        // rank may copy in to the next graph slot while a peer still reads
        // this one), then catch up.
        std::this_thread::sleep_for(std::chrono::microseconds(200 * ((i + r) % 3)));
        for (int64_t k = 0; k < call.count; ++k) in[size_t(k)] = value(r, i, k);
        const uint64_t seq = c.seq;
        float* dst = call.in_place ? in.data() : out.data();
        const cudaError_t err = cuda_ipc::allreduce_graphed(c, DType::F32, call.op, in.data(), dst, call.count,
                                                            nullptr);
        expect(err == cudaSuccess, "graphed call returned an error");
        seq_untouched[size_t(r)] &= int(c.seq == seq);
        got[size_t(r)].emplace_back(dst, dst + call.count);
        if (i % 3 == 2) {  // an eager call between replays
          std::fill(eager.begin(), eager.end(), float(r + 1));
          cuda_ipc::allreduce_one_shot(c, DType::F32, ReduceOp::SUM, eager.data(), eager.data(), 64, nullptr);
          expect(eager[0] == float(n * (n + 1) / 2), "eager call between graphed calls");
        }
      }
      // Refused before any launch: the status below stays 0 (no peer is waited for).
      too_big_refused[size_t(r)] =
          cuda_ipc::allreduce_graphed(c, DType::F32, ReduceOp::SUM, in.data(), out.data(), 1025, nullptr) ==
          cudaErrorInvalidValue;
      cuda_ipc::read_status(c, nullptr, &status[size_t(r)]);
    });
  }
  for (auto& t : threads) t.join();
  char what[160];
  for (int r = 0; r < n; ++r) {
    std::snprintf(what, sizeof(what), "graphed: status of rank %d of %d is %u, failure word %u", r, n,
                  status[size_t(r)], word[size_t(r)]);
    expect(status[size_t(r)] == 0 && word[size_t(r)] == 0, what);
    expect(seq_untouched[size_t(r)] != 0, "graphed calls leave the eager phase numbering alone");
    expect(too_big_refused[size_t(r)] != 0, "a graphed call larger than a slot is refused");
    for (int i = 0; i < calls; ++i) {
      const Call call{false, i % 2 == 0, sizes[i % 8], ReduceOp(i % 5)};
      const auto e = expected<float>(n, call, i);
      std::snprintf(what, sizeof(what), "graphed call %d (count %ld, op %s) rank %d n=%d", i, long(call.count),
                    op_name(call.op), r, n);
      expect(got[size_t(r)][size_t(i)].size() == e.size() &&
                 std::memcmp(got[size_t(r)][size_t(i)].data(), e.data(), e.size() * sizeof(float)) == 0,
             what);
    }
  }
}

// Rank 0 replays a graph of 100 elements, the others one of 101: every rank
// fails (kMismatch, or kPeerAborted once a peer gave up) instead of hanging.
void check_graphed_mismatch(int n) {
  const size_t slot_bytes = 4096;
  Arenas arenas(n, slot_bytes);
  std::vector<uint32_t> status(size_t(n), 0), word(size_t(n), 0);
  std::vector<cuda_ipc::MismatchRecord> record(size_t(n), cuda_ipc::MismatchRecord{});
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cuda_ipc::IpcComm c = comm_for(arenas, r, slot_bytes);
      c.timeout_ns = 2ull * 1000 * 1000 * 1000;
      c.host_mismatch = &record[size_t(r)];
      c.host_replay_failure = &word[size_t(r)];
      std::vector<float> in(101, 1.0f);
      cuda_ipc::allreduce_graphed(c, DType::F32, ReduceOp::SUM, in.data(), in.data(), r == 0 ? 100 : 101, nullptr);
      cuda_ipc::read_status(c, nullptr, &status[size_t(r)]);
    });
  }
  for (auto& t : threads) t.join();
  char what[160];
  for (int r = 0; r < n; ++r) {
    const auto s = flags::WaitStatus(status[size_t(r)]);
    std::snprintf(what, sizeof(what), "graphed mismatch: rank %d of %d ended with status %u", r, n,
                  status[size_t(r)]);
    expect(s == flags::WaitStatus::kMismatch || s == flags::WaitStatus::kPeerAborted, what);
    check_record(record[size_t(r)], s, r, n, kAuxGraphed, "graphed mismatch");
    std::snprintf(what, sizeof(what), "graphed mismatch: rank %d of %d's failure word %u, status %u", r, n,
                  word[size_t(r)], status[size_t(r)]);
    expect(word[size_t(r)] == status[size_t(r)], what);
  }
}

}  // namespace

int main() {
  cuda_kernels::g_blocks = 2;
  cuda_kernels::g_threads = 3;
  for (int n = 2; n <= 4; ++n) {
    for (size_t slot_bytes : {size_t(256), size_t(4096), size_t(1) << 20}) check_sequence(n, slot_bytes);
    check_mismatch(n);
  }
  // One-shot calls that fit a slot ran as the fused kernel (per-block flags,
  // blocks at once); the three-launch schedule stays covered too.
  expect(cuda_ipc::g_fused_launches > 0, "the fused one-shot ran");
  expect(cuda_ipc::g_two_shot_launches > 0, "the fused two-shot ran");
  emulated::g_fused_one_shot = false;
  emulated::g_fused_two_shot = false;
  const int fused_before = cuda_ipc::g_fused_launches, two_shot_before = cuda_ipc::g_two_shot_launches;
  for (int n = 2; n <= 4; ++n) {
    for (size_t slot_bytes : {size_t(256), size_t(4096)}) check_sequence(n, slot_bytes);
    check_mismatch(n);
  }
  expect(cuda_ipc::g_fused_launches == fused_before, "fused_one_shot = false runs the three-launch schedule");
  expect(cuda_ipc::g_two_shot_launches == two_shot_before, "fused_two_shot = false runs the step-by-step schedule");
  emulated::g_fused_one_shot = true;
  emulated::g_fused_two_shot = true;
  for (int n = 1; n <= 4; ++n) check_graphed(n);
  expect(cuda_ipc::g_graph_launches > 0, "the graphed kernel ran");
  for (int n = 2; n <= 4; ++n) check_graphed_mismatch(n);
  // Registered buffers both ways: the push in one kernel (fused_two_shot) and
  // step by step; then a mix of the two.
  const int registered_before = cuda_ipc::g_collective_launches;
  for (bool fused : {true, false}) {
    emulated::g_fused_two_shot = fused;
    for (int n = 2; n <= 5; ++n)
      for (size_t slot_bytes : {size_t(256), size_t(4096)}) check_registered(n, slot_bytes);
    if (fused) expect(cuda_ipc::g_collective_launches > registered_before, "the registered push ran");
  }
  emulated::g_fused_two_shot = true;
  for (int n = 2; n <= 4; ++n) check_registered_mix(n);
  std::printf("%ld checks, %ld failures\n", long(checks.load()), long(failures.load()));
  return failures == 0 ? 0 : 1;
}
