// The CUDA IPC broadcast / all_gather / gather / scatter / all_to_all /
// reduce / reduce_scatter schedules
// (core/executors/cuda_ipc/ipc_collectives.cpp) and the host abort word, run on
// the host: one thread per rank stands for one process (emulated_ipc.h).
// Checked:
//   * one long random sequence of calls of every collective, interleaved with
//     allreduce on the same communicator (slot and descriptor rotation across
//     ops): every rank's output equals the reference bit for bit (reductions:
//     the in-order reduction of cpu_reduce.h), sizes 0, 1, odd, one slot,
//     several slots; buffers a rank must not write stay untouched;
//   * desynced calls (different root, count, op or dtype, even with 0 bytes)
//     fail on every rank with kMismatch or kPeerAborted, without hanging;
//   * all of the above twice: step by step (fused_collectives = false) and as
//     the one-kernel collectives (ipc_fused_collectives.h), whose reductions
//     must give the step schedule's bits; a rank in one form and its peers in
//     the other fail with kMismatch (schedule=fused) or kPeerAborted;
//   * the one-kernel collectives in both forms of the block barriers
//     (ipc_arena.h, FlagForm), the mix with the step schedule included;
//   * a rank whose peer never arrives (a dead process) gives up when the host
//     writes the host abort word, long before its 20 s flag-wait timeout,
//     records kPeerDead in its status and mirror, and its control-block abort
//     releases the other survivors (kPeerAborted).
// Exit status 0 = every check passed.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "emulated_checks.h"
#include "emulated_ipc.h"
#include "csrc/core/kernels/cpu_reduce.h"

#include "csrc/core/executors/cuda_ipc/ipc_allreduce.cpp"
#include "csrc/core/executors/cuda_ipc/ipc_collectives.cpp"

using namespace fastpar;
using emulated::Arenas;
using emulated::comm_for;

namespace {

enum class Kind { kBroadcast, kAllgather, kReduce, kReduceScatter, kAllreduce, kGather, kScatter, kAllToAll, kBarrier };
constexpr unsigned kKinds = 9;
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kBroadcast: return "broadcast";
    case Kind::kAllgather: return "all_gather";
    case Kind::kReduce: return "reduce";
    case Kind::kReduceScatter: return "reduce_scatter";
    case Kind::kAllreduce: return "all_reduce";
    case Kind::kGather: return "gather";
    case Kind::kScatter: return "scatter";
    case Kind::kAllToAll: return "all_to_all";
    case Kind::kBarrier: return "barrier";
  }
  return "?";
}

// Per rank: the index + 1 of the last barrier it entered (check_sequence resets them).
std::atomic<int> arrivals[cuda_ipc::kMaxIpcRanks];

struct Call {
  Kind kind;
  int64_t count;  // elements per rank (reduce_scatter: per output)
  int root;
  ReduceOp op;
  bool half;  // float16 instead of float32
};

float value(int rank, int call, int64_t i) {
  return float((rank * 7 + call * 3 + i * 5) % 17) - 8.0f + 0.25f * float(rank);
}

template <typename T>
T from_float(float f) {
  if constexpr (std::is_same_v<T, f16>) return to_f16(f);
  else return T(f);
}

template <typename T>
void fill(std::vector<T>& v, int rank, int call) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = from_float<T>(value(rank, call, int64_t(i)));
}

template <typename T>
std::vector<T> reduce_ref(const std::vector<std::vector<T>>& ins, int64_t begin, int64_t count, ReduceOp op) {
  std::vector<const T*> srcs;
  for (const auto& in : ins) srcs.push_back(in.data() + begin);
  std::vector<T> out(static_cast<size_t>(count));
  T* d = out.data();
  FASTPAR_DISPATCH_OP(op, [&] { cpu_reduce_range<T, kOp>(srcs.data(), int(srcs.size()), &d, 1, 0, count, int(srcs.size())); });
  return out;
}

template <typename T>
bool same_bits(const T* a, const std::vector<T>& b) {
  return b.empty() || std::memcmp(a, b.data(), b.size() * sizeof(T)) == 0;  // memcmp never takes null
}

// Runs `call` on rank c.rank and checks its result against the reference.
template <typename T>
void run_and_check(cuda_ipc::IpcComm& c, const Call& call, int index, char* what_prefix) {
  const int n = c.size, r = c.rank;
  const DType dt = std::is_same_v<T, f16> ? DType::F16 : DType::F32;
  const T sentinel = from_float<T>(-99.0f);
  char what[240];
  auto label = [&](const char* check) {
    std::snprintf(what, sizeof(what), "%s call %d %s count %ld root %d op %s %s rank %d: %s", what_prefix, index,
                  kind_name(call.kind), long(call.count), call.root, op_name(call.op), call.half ? "f16" : "f32", r,
                  check);
    return what;
  };
  // Every rank's input of this call (the reference needs the peers' too).
  const bool blocks = call.kind == Kind::kReduceScatter || call.kind == Kind::kScatter || call.kind == Kind::kAllToAll;
  const int64_t in_count = blocks ? call.count * n : call.count;
  std::vector<std::vector<T>> ins(static_cast<size_t>(n), std::vector<T>(static_cast<size_t>(in_count)));
  for (int q = 0; q < n; ++q) fill(ins[size_t(q)], q, index);
  std::vector<T> mine = ins[size_t(r)];
  cudaError_t err = cudaSuccess;
  switch (call.kind) {
    case Kind::kBroadcast: {
      std::vector<T> data = r == call.root ? mine : std::vector<T>(mine.size(), sentinel);
      err = cuda_ipc::broadcast_ipc(c, int32_t(dt), call.count, data.data(), call.count * int64_t(sizeof(T)),
                                    call.root, nullptr);
      expect(same_bits(data.data(), ins[size_t(call.root)]), label("data != root's"));
      break;
    }
    case Kind::kAllgather: {
      std::vector<T> out(size_t(call.count * n), sentinel);
      void* outs[cuda_ipc::kMaxIpcRanks];
      for (int q = 0; q < n; ++q) outs[q] = out.data() + q * call.count;
      err = cuda_ipc::allgather_ipc(c, int32_t(dt), call.count, mine.data(), outs, call.count * int64_t(sizeof(T)),
                                    nullptr);
      for (int q = 0; q < n; ++q) expect(same_bits(out.data() + q * call.count, ins[size_t(q)]), label("block != rank's input"));
      break;
    }
    case Kind::kReduce: {
      std::vector<T> out(mine.size(), sentinel);
      err = cuda_ipc::reduce_ipc(c, dt, call.op, mine.data(), out.data(), call.count, call.root, nullptr);
      if (r == call.root) {
        expect(same_bits(out.data(), reduce_ref(ins, 0, call.count, call.op)), label("root's output != reduction"));
      } else {
        expect(std::all_of(out.begin(), out.end(), [&](T v) { return std::memcmp(&v, &sentinel, sizeof(T)) == 0; }),
               label("a non-root's output was written"));
      }
      expect(same_bits(mine.data(), ins[size_t(r)]), label("the input was modified"));
      break;
    }
    case Kind::kReduceScatter: {
      std::vector<T> out(size_t(call.count), sentinel);
      const void* blocks[cuda_ipc::kMaxIpcRanks];
      for (int q = 0; q < n; ++q) blocks[q] = mine.data() + q * call.count;
      err = cuda_ipc::reduce_scatter_ipc(c, dt, call.op, blocks, out.data(), call.count, nullptr);
      expect(same_bits(out.data(), reduce_ref(ins, r * call.count, call.count, call.op)),
             label("output != reduction of block r"));
      break;
    }
    case Kind::kAllreduce: {
      err = cuda_ipc::allreduce_two_shot(c, dt, call.op, mine.data(), mine.data(), call.count, nullptr);
      expect(same_bits(mine.data(), reduce_ref(ins, 0, call.count, call.op)), label("output != reduction"));
      break;
    }
    case Kind::kGather: {
      std::vector<T> out(size_t(call.count * n), sentinel);
      void* outs[cuda_ipc::kMaxIpcRanks];
      for (int q = 0; q < n; ++q) outs[q] = out.data() + q * call.count;
      err = cuda_ipc::gather_ipc(c, int32_t(dt), call.count, mine.data(), outs, call.count * int64_t(sizeof(T)),
                                 call.root, nullptr);
      for (int q = 0; q < n; ++q) {
        if (r == call.root) {
          expect(same_bits(out.data() + q * call.count, ins[size_t(q)]), label("root's block != rank's input"));
        } else {
          expect(std::all_of(out.begin(), out.end(), [&](T v) { return std::memcmp(&v, &sentinel, sizeof(T)) == 0; }),
                 label("a non-root's output was written"));
        }
      }
      break;
    }
    case Kind::kScatter: {
      std::vector<T> out(size_t(call.count), sentinel);
      const void* blocks_of_root[cuda_ipc::kMaxIpcRanks];
      for (int q = 0; q < n; ++q) blocks_of_root[q] = mine.data() + q * call.count;
      err = cuda_ipc::scatter_ipc(c, int32_t(dt), call.count, blocks_of_root, out.data(),
                                  call.count * int64_t(sizeof(T)), call.root, nullptr);
      const std::vector<T> want(ins[size_t(call.root)].begin() + r * call.count,
                                ins[size_t(call.root)].begin() + (r + 1) * call.count);
      expect(same_bits(out.data(), want), label("output != root's block r"));
      break;
    }
    case Kind::kAllToAll: {
      // In place for odd counts (ins alias outs block for block), else out of place.
      const bool in_place = call.count % 2 == 1;
      std::vector<T> out(size_t(call.count * n), sentinel);
      T* dst = in_place ? mine.data() : out.data();
      const void* src_blocks[cuda_ipc::kMaxIpcRanks];
      void* dst_blocks[cuda_ipc::kMaxIpcRanks];
      for (int q = 0; q < n; ++q) {
        src_blocks[q] = mine.data() + q * call.count;
        dst_blocks[q] = dst + q * call.count;
      }
      err = cuda_ipc::all_to_all_ipc(c, int32_t(dt), call.count, src_blocks, dst_blocks,
                                     call.count * int64_t(sizeof(T)), nullptr);
      for (int q = 0; q < n; ++q) {
        const std::vector<T> want(ins[size_t(q)].begin() + r * call.count, ins[size_t(q)].begin() + (r + 1) * call.count);
        expect(same_bits(dst + q * call.count, want), label("block q != rank q's block r"));
      }
      break;
    }
    case Kind::kBarrier: {
      // Every rank must have entered: each bumps its arrival count before the
      // call, and after it sees the peers' counts at least at this call's.
      arrivals[size_t(r)].store(index + 1);
      err = cuda_ipc::barrier_ipc(c, nullptr);
      for (int q = 0; q < n; ++q) expect(arrivals[size_t(q)].load() >= index + 1, label("left before a peer arrived"));
      break;
    }
  }
  expect(err == cudaSuccess, label("schedule returned an error"));
}

void check_sequence(int n, size_t slot_bytes) {
  std::mt19937 rng(unsigned(n * 7919 + slot_bytes));
  std::vector<Call> calls;
  const int64_t sizes[] = {0, 1, 3, 17, 64, 100, 1000, 5000};
  for (int i = 0; i < 80; ++i) {
    Call c{Kind(rng() % kKinds), sizes[rng() % 8], int(rng() % unsigned(n)), ReduceOp(rng() % 5), bool(rng() % 2)};
    calls.push_back(c);
  }
  Arenas arenas(n, slot_bytes);
  std::vector<uint32_t> status(size_t(n), 0);
  std::vector<std::thread> threads;
  for (std::atomic<int>& a : arrivals) a.store(0);
  char prefix[64];
  std::snprintf(prefix, sizeof(prefix), "%s n=%d slot=%zu", emulated::g_fused_collectives ? "fused" : "steps", n,
                slot_bytes);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cuda_ipc::IpcComm c = comm_for(arenas, r, slot_bytes);
      for (size_t i = 0; i < calls.size(); ++i) {
        if (calls[i].half) run_and_check<f16>(c, calls[i], int(i), prefix);
        else run_and_check<float>(c, calls[i], int(i), prefix);
      }
      cuda_ipc::read_status(c, nullptr, &status[size_t(r)]);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) expect(status[size_t(r)] == 0, "a rank's status word is set after a clean sequence");
}

// Ranks disagree on one field of the call; every rank must fail, not hang.
void check_desync(int n, int variant) {
  const size_t slot_bytes = 4096;
  Arenas arenas(n, slot_bytes);
  std::vector<uint32_t> status(size_t(n), 0), mirror(size_t(n), 0);
  std::vector<cuda_ipc::MismatchRecord> record(size_t(n), cuda_ipc::MismatchRecord{});
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cuda_ipc::IpcComm c = comm_for(arenas, r, slot_bytes);
      c.timeout_ns = 2ull * 1000 * 1000 * 1000;
      c.host_status = &mirror[size_t(r)];
      c.host_mismatch = &record[size_t(r)];
      std::vector<float> buf(64, 1.0f), out(64 * size_t(n), 0.0f);
      void* outs[cuda_ipc::kMaxIpcRanks];
      for (int q = 0; q < n; ++q) outs[q] = out.data() + q * 64;
      switch (variant) {
        case 0:  // broadcast roots differ, zero bytes: the phase still meets
          cuda_ipc::broadcast_ipc(c, int32_t(DType::F32), 0, buf.data(), 0, r == 0 ? 0 : 1, nullptr);
          break;
        case 1:  // all_gather counts differ
          cuda_ipc::allgather_ipc(c, int32_t(DType::F32), r == 0 ? 64 : 32, buf.data(), outs, r == 0 ? 256 : 128,
                                  nullptr);
          break;
        case 2:  // reduce vs reduce_scatter
          if (r == 0) {
            cuda_ipc::reduce_ipc(c, DType::F32, ReduceOp::SUM, buf.data(), buf.data(), 16, 0, nullptr);
          } else {
            const void* ins[cuda_ipc::kMaxIpcRanks];
            for (int q = 0; q < n; ++q) ins[q] = out.data() + q * 16;
            cuda_ipc::reduce_scatter_ipc(c, DType::F32, ReduceOp::SUM, ins, buf.data(), 16, nullptr);
          }
          break;
        case 5:  // rank 0 step by step, its peers one kernel, same call
          c.fused_collectives = r != 0 ? !emulated::g_fused_collectives : emulated::g_fused_collectives;
          cuda_ipc::broadcast_ipc(c, int32_t(DType::F32), 64, buf.data(), 256, 0, nullptr);
          break;
        case 4:  // gather vs scatter, same root and bytes
          if (r == 0) {
            cuda_ipc::gather_ipc(c, int32_t(DType::F32), 16, buf.data(), outs, 64, 0, nullptr);
          } else {
            const void* ins[cuda_ipc::kMaxIpcRanks];
            for (int q = 0; q < n; ++q) ins[q] = out.data() + q * 16;
            cuda_ipc::scatter_ipc(c, int32_t(DType::F32), 16, ins, buf.data(), 64, 0, nullptr);
          }
          break;
        default:  // reduce ops differ
          cuda_ipc::reduce_ipc(c, DType::F32, r == 0 ? ReduceOp::SUM : ReduceOp::MAX, buf.data(), buf.data(), 16, 0,
                               nullptr);
      }
      cuda_ipc::read_status(c, nullptr, &status[size_t(r)]);
    });
  }
  for (auto& t : threads) t.join();
  char what[160];
  for (int r = 0; r < n; ++r) {
    const auto s = flags::WaitStatus(status[size_t(r)]);
    std::snprintf(what, sizeof(what), "desync variant %d: rank %d of %d ended with status %u", variant, r, n,
                  status[size_t(r)]);
    expect(s == flags::WaitStatus::kMismatch || s == flags::WaitStatus::kPeerAborted, what);
    expect(mirror[size_t(r)] == status[size_t(r)], "desync: the host status mirror differs from the status word");
    // A rank that saw the mismatch itself recorded who and what, for the
    // host's message; one that was only aborted has nothing to name.
    const cuda_ipc::MismatchRecord& m = record[size_t(r)];
    const int peer = int(m.peer_plus_one) - 1;
    if (s == flags::WaitStatus::kMismatch) {
      expect(peer >= 0 && peer < n && peer != r, "desync: the mismatch record names a peer");
      expect(!flags::same_call(m.mine, m.theirs), "desync: the recorded calls differ");
      const Coll want = variant == 2 ? (r == 0 ? Coll::kReduce : Coll::kReduceScatter)
                        : variant == 4 ? (r == 0 ? Coll::kGather : Coll::kScatter)
                        : variant == 0 ? Coll::kBroadcast
                        : variant == 1 ? Coll::kAllgather
                        : variant == 5 ? Coll::kBroadcast
                                       : Coll::kReduce;
      expect(m.mine.op == int32_t(want), "desync: the record's own call is this rank's");
      if (variant == 5) {
        const int64_t fused = emulated::fused_aux(kAuxFusedCollective);
        expect((m.mine.aux == fused) != (m.theirs.aux == fused),
               "desync: the record names the fused schedule on one side only");
      }
    } else {
      expect(m.peer_plus_one == 0, "desync: an aborted rank records no mismatch");
    }
  }
}

// Rank n-1 "dies" (never calls); rank 0's host raises its host abort word
// after 50 ms, as the peer watcher does. With a 20 s flag-wait timeout, every
// survivor must return within seconds: rank 0 with kPeerDead, the others with
// kPeerAborted (rank 0's control-block abort) or kPeerDead.
void check_host_abort(int n) {
  const size_t slot_bytes = 4096;
  Arenas arenas(n, slot_bytes);
  std::vector<uint32_t> status(size_t(n), 0), mirror(size_t(n), 0);
  uint64_t host_abort0 = 0;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r + 1 < n; ++r) {
    threads.emplace_back([&, r] {
      cuda_ipc::IpcComm c = comm_for(arenas, r, slot_bytes);
      c.host_status = &mirror[size_t(r)];
      if (r == 0) c.host_abort = &host_abort0;
      std::vector<float> buf(100, 1.0f);
      cuda_ipc::broadcast_ipc(c, int32_t(DType::F32), 100, buf.data(), 400, 0, nullptr);
      cuda_ipc::read_status(c, nullptr, &status[size_t(r)]);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  __atomic_store_n(&host_abort0, uint64_t(flags::WaitStatus::kPeerDead), __ATOMIC_RELEASE);
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char what[160];
  std::snprintf(what, sizeof(what), "host abort n=%d: survivors took %.2f s (flag-wait timeout 20 s)", n, secs);
  expect(secs < 5.0, what);
  std::snprintf(what, sizeof(what), "host abort n=%d: rank 0 status %u, mirror %u", n, status[0], mirror[0]);
  expect(status[0] == uint32_t(flags::WaitStatus::kPeerDead) && mirror[0] == status[0], what);
  for (int r = 1; r + 1 < n; ++r) {
    const auto s = flags::WaitStatus(status[size_t(r)]);
    std::snprintf(what, sizeof(what), "host abort n=%d: rank %d status %u", n, r, status[size_t(r)]);
    expect(s == flags::WaitStatus::kPeerAborted, what);
  }
}

// all_gather_into_tensor with 4 KiB + 4 bytes per rank (fused form): rank
// q's block of the output starts 4q bytes past a 16-byte boundary, while the
// slots are aligned, so no copy shares 16-byte alignment with its source.
// Every copy must still move words (8 or 4 bytes: the widest both ends
// share), never one byte at a time, and the bits must be the inputs'.
void check_misaligned_allgather(int n) {
  const int64_t bytes = 4096 + 4, count = bytes / 4;
  Arenas arenas(n, 1 << 20);
  std::vector<std::vector<float>> outs(static_cast<size_t>(n));
  for (auto& l : cuda_ipc::g_fused_loops) l = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cuda_ipc::IpcComm c = comm_for(arenas, r, 1 << 20);
      std::vector<float> in(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) in[size_t(i)] = float(r * 100000 + i);
      std::vector<float>& out = outs[size_t(r)];
      out.assign(size_t(count * n), -1.0f);
      void* o[cuda_ipc::kMaxIpcRanks];
      for (int q = 0; q < n; ++q) o[q] = out.data() + q * count;
      cuda_ipc::allgather_ipc(c, int32_t(DType::F32), count, in.data(), o, bytes, nullptr);
    });
  }
  for (auto& t : threads) t.join();
  char what[200];
  for (int r = 0; r < n; ++r) {
    bool right = true;
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < count; ++i) right = right && outs[size_t(r)][size_t(q * count + i)] == float(q * 100000 + i);
    std::snprintf(what, sizeof(what), "misaligned all_gather n=%d: rank %d's output", n, r);
    expect(right, what);
  }
  using cuda_ipc::FusedLoop;
  const auto ran = [](FusedLoop l) { return long(cuda_ipc::g_fused_loops[int(l)].load()); };
  std::snprintf(what, sizeof(what), "misaligned all_gather n=%d: loops 16:%ld 8:%ld 4:%ld 2:%ld scalar:%ld", n,
                ran(FusedLoop::kPack16), ran(FusedLoop::kWord8), ran(FusedLoop::kWord4), ran(FusedLoop::kWord2),
                ran(FusedLoop::kScalar));
  expect(ran(FusedLoop::kScalar) == 0 && ran(FusedLoop::kWord2) == 0 && ran(FusedLoop::kWord4) > 0, what);
  if (n > 2) expect(ran(FusedLoop::kWord8) > 0, what);  // rank 2's block: 8 bytes past a boundary
}

}  // namespace

int main() {
  cuda_kernels::g_blocks = 2;
  cuda_kernels::g_threads = 3;
  // The step schedules and the fused kernel.
  for (bool fused : {false, true})
    for (cuda_ipc::FlagForm form : emulated::kFlagForms) {
      // The step schedules have no block barriers: one form.
      if (!fused && form != cuda_ipc::FlagForm::kPollPeer) continue;
      emulated::g_fused_collectives = fused;
      emulated::g_flag_form = form;
      std::fprintf(stderr, "checks %s, %s\n", fused ? "fused" : "step by step", emulated::flag_form_name(form));
      for (int n = 2; n <= 5; ++n) {
        for (size_t slot_bytes : {size_t(256), size_t(4096), size_t(1) << 20}) check_sequence(n, slot_bytes);
        for (int v = 0; v < 6; ++v) check_desync(n, v);
        check_host_abort(n);
        if (fused) check_misaligned_allgather(n);
      }
    }
  std::printf("%ld checks, %ld failures\n", long(checks.load()), long(failures.load()));
  return failures == 0 ? 0 : 1;
}
