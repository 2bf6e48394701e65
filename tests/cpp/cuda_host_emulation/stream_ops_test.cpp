// Stream operations and bytes per call, counted by the fake runtime
// (fake_cuda::StreamOps: kernel launches, memcpys and event operations each
// rank's thread enqueues; bytes the emulated kernels and copies read plus
// write, flags not counted). On a GPU every operation costs a few
// microseconds of host and stream time whatever its size (8 us under MPS),
// so these counts are the latency floor of each schedule, and the bytes its
// bandwidth floor. The table below pins today's counts per collective, rank
// count and size class: a change in either shows up here, and the fused
// kernels are held to what they promise (one launch per call).
//
// n ranks, m = chunks of a slot (here a 4096-byte slot: 1024 float32), N =
// bytes of one rank's tensor:
//   two-shot, step by step        2mn + 1 launches, (5n - 2) N bytes (all ranks)
//   two-shot, fused kernel        1 launch, the same bytes
//   registered two-shot           m(n + 1) + 2 launches, (3n - 1) N bytes
//   registered push, one kernel   1 launch, 2nN bytes
//   one-shot, fused (fits a slot) 1 launch, n(n + 3) N bytes
//   list ring on one GPU          1 launch (was n per n-segment window), 2n N bytes
//   broadcast, all_gather, gather, scatter, all_to_all, reduce, reduce_scatter:
//     step by step, the counts pinned in kExpected; fused kernel, 1 launch
//     and the same bytes, every size (0 bytes included)
// Exit status 0 = every check passed; the table is printed either way.
#include <barrier>
#include <cstdio>
#include <cstring>
#include <functional>
#include <list>
#include <string>
#include <thread>
#include <vector>

#include "emulated_checks.h"
#include "emulated_ipc.h"
#include "emulated_p2p.h"

#include "csrc/core/executors/cuda_ipc/ipc_allreduce.cpp"
#include "csrc/core/executors/cuda_ipc/ipc_collectives.cpp"
#include "csrc/core/executors/cuda_ipc/ipc_p2p.cpp"
#include "csrc/core/transport/cuda_p2p/handle_cache.cpp"
#include "csrc/core/executors/cuda_p2p/ring_allreduce.cpp"

using namespace fastpar;

namespace {

constexpr size_t kSlot = 4096;
constexpr int64_t kChunk = int64_t(kSlot) / 4;  // float32 elements per chunk

struct Counted {
  fake_cuda::StreamOps rank0;  // what rank 0 enqueued
  int64_t bytes_all = 0;       // bytes of every rank's operations
};

// Runs `call(c, r)` once on every rank (a thread each), after one warm-up
// all_reduce, and returns what each call enqueued.
Counted count_call(int n, const std::function<void(cuda_ipc::IpcComm&, int)>& call, size_t registered = 0) {
  emulated::Arenas arenas(n, kSlot, registered);
  std::vector<fake_cuda::StreamOps> got(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      cuda_ipc::IpcComm c = emulated::comm_for(arenas, r, kSlot);
      fake_cuda::stream_ops = {};
      call(c, r);
      got[size_t(r)] = fake_cuda::stream_ops;
      uint32_t st = 1;
      cuda_ipc::read_status(c, nullptr, &st);
      expect(st == 0, "the counted call succeeded");
    });
  for (auto& t : threads) t.join();
  Counted out{got[0], 0};
  for (const auto& g : got) out.bytes_all += g.bytes;
  return out;
}

struct Row {
  const char* what;
  int n;
  int64_t count;  // float32 elements per rank
  int64_t launches, memcpys, events;
  int64_t bytes_per_n;  // all ranks' bytes / N
};

std::vector<Row> g_rows;
std::list<std::string> g_names;  // row names made at run time (stable addresses)

void record(const char* what, int n, int64_t count, const Counted& k) {
  const int64_t N = count * 4;
  g_rows.push_back({what, n, count, k.rank0.launches, k.rank0.memcpys, k.rank0.event_ops,
                    N > 0 ? k.bytes_all / N : 0});
}

int64_t chunks(int64_t count) { return std::max<int64_t>(1, (count + kChunk - 1) / kChunk); }

void allreduce_rows(int n) {
  // 17: fits one block; kChunk: one chunk; 5 * kChunk + 100: six chunks.
  for (int64_t count : {int64_t(17), kChunk, 5 * kChunk + 100}) {
    auto run = [&](bool fused_one, bool fused_two, bool two_shot) {
      return count_call(n, [&](cuda_ipc::IpcComm& c, int r) {
        c.fused_one_shot = fused_one;
        c.fused_two_shot = fused_two;
        std::vector<float> x(static_cast<size_t>(count), float(r)), y(static_cast<size_t>(count));
        two_shot ? cuda_ipc::allreduce_two_shot(c, DType::F32, ReduceOp::SUM, x.data(), y.data(), count, nullptr)
                 : cuda_ipc::allreduce_one_shot(c, DType::F32, ReduceOp::SUM, x.data(), y.data(), count, nullptr);
      });
    };
    const int64_t m = chunks(count);
    char what[160];
    const Counted steps = run(true, false, true);
    record("all_reduce two-shot, step by step", n, count, steps);
    std::snprintf(what, sizeof(what), "two-shot step by step n=%d count %ld: 2mn+1 = %ld launches, got %ld", n,
                  long(count), long(2 * m * n + 1), long(steps.rank0.launches));
    // Every shard non-empty in these sizes, so every copy is enqueued.
    if (count >= kChunk) expect(steps.rank0.launches == 2 * m * n + 1 && steps.rank0.total() == steps.rank0.launches, what);
    std::snprintf(what, sizeof(what), "two-shot step by step n=%d count %ld: (5n-2)N bytes", n, long(count));
    expect(steps.bytes_all == (5 * n - 2) * count * 4, what);

    const Counted fused = run(true, true, true);
    record("all_reduce two-shot, fused kernel", n, count, fused);
    std::snprintf(what, sizeof(what), "fused two-shot n=%d count %ld: one launch, got %ld ops", n, long(count),
                  long(fused.rank0.total()));
    expect(fused.rank0.launches == 1 && fused.rank0.total() == 1, what);
    std::snprintf(what, sizeof(what), "fused two-shot n=%d count %ld: the step-by-step bytes", n, long(count));
    expect(fused.bytes_all == steps.bytes_all, what);

    if (count <= kChunk) {
      const Counted one = run(true, true, false);
      record("all_reduce one-shot, fused kernel", n, count, one);
      expect(one.rank0.total() == 1 && one.bytes_all == int64_t(n) * (n + 3) * count * 4,
             "fused one-shot: one launch, n(n+3)N bytes");
      const Counted one_steps = run(false, true, false);
      record("all_reduce one-shot, step by step", n, count, one_steps);
      expect(one_steps.rank0.total() == 3, "one-shot step by step: copy-in, phase, reduce");
    }
  }
}

void registered_rows(int n) {
  for (int64_t count : {kChunk, 5 * kChunk + 100}) {
    auto run = [&](bool fused) {
      return count_call(
          n,
          [&](cuda_ipc::IpcComm& c, int r) {
            c.fused_two_shot = fused;
            float* buf = reinterpret_cast<float*>(cuda_ipc::registered_of(c.bases[r], c.slot_bytes));
            for (int64_t i = 0; i < count; ++i) buf[i] = float(r);
            cuda_ipc::allreduce_registered(c, DType::F32, ReduceOp::SUM, 0, count, nullptr);
          },
          size_t(count) * 4);
    };
    const Counted k = run(false);
    record("all_reduce registered, step by step", n, count, k);
    const int64_t m = chunks(count);
    char what[160];
    std::snprintf(what, sizeof(what), "registered n=%d count %ld: m(n+1)+2 = %ld launches, got %ld", n, long(count),
                  long(m * (n + 1) + 2), long(k.rank0.launches));
    expect(k.rank0.launches == m * (n + 1) + 2 && k.rank0.total() == k.rank0.launches, what);
    expect(k.bytes_all == (3 * n - 1) * count * 4, "registered: (3n-1)N bytes");
    const Counted push = run(true);
    record("all_reduce registered, push kernel", n, count, push);
    expect(push.rank0.launches == 1 && push.rank0.total() == 1, "registered push: one launch");
    std::snprintf(what, sizeof(what), "registered push n=%d count %ld: 2nN = %ld bytes, got %ld", n, long(count),
                  long(2 * n * count * 4), long(push.bytes_all));
    expect(push.bytes_all == 2 * n * count * 4, what);
  }
}

// The other IPC collectives, each step by step (pinned by kExpected below) and
// as the fused kernel: one launch per call, the step-by-step bytes.
void collective_rows(int n) {
  using Call = std::function<void(cuda_ipc::IpcComm&, int, int64_t)>;
  const std::pair<const char*, Call> calls[] = {
      {"broadcast",
       [](cuda_ipc::IpcComm& c, int, int64_t count) {
         std::vector<float> x(static_cast<size_t>(count), 1.0f);
         cuda_ipc::broadcast_ipc(c, int32_t(DType::F32), count, x.data(), count * 4, 0, nullptr);
       }},
      {"all_gather",
       [](cuda_ipc::IpcComm& c, int, int64_t count) {
         std::vector<float> x(static_cast<size_t>(count), 1.0f), all(size_t(count) * size_t(c.size));
         void* outs[cuda_ipc::kMaxIpcRanks];
         for (int q = 0; q < c.size; ++q) outs[q] = all.data() + q * count;
         cuda_ipc::allgather_ipc(c, int32_t(DType::F32), count, x.data(), outs, count * 4, nullptr);
       }},
      {"gather",
       [](cuda_ipc::IpcComm& c, int, int64_t count) {
         std::vector<float> x(static_cast<size_t>(count), 1.0f), all(size_t(count) * size_t(c.size));
         void* outs[cuda_ipc::kMaxIpcRanks];
         for (int q = 0; q < c.size; ++q) outs[q] = all.data() + q * count;
         cuda_ipc::gather_ipc(c, int32_t(DType::F32), count, x.data(), outs, count * 4, 0, nullptr);
       }},
      {"scatter",
       [](cuda_ipc::IpcComm& c, int, int64_t count) {
         std::vector<float> x(size_t(count) * size_t(c.size), 1.0f), y(static_cast<size_t>(count));
         const void* ins[cuda_ipc::kMaxIpcRanks];
         for (int q = 0; q < c.size; ++q) ins[q] = x.data() + q * count;
         cuda_ipc::scatter_ipc(c, int32_t(DType::F32), count, ins, y.data(), count * 4, 0, nullptr);
       }},
      {"all_to_all",
       [](cuda_ipc::IpcComm& c, int, int64_t count) {
         std::vector<float> x(size_t(count) * size_t(c.size), 1.0f), y(size_t(count) * size_t(c.size));
         const void* ins[cuda_ipc::kMaxIpcRanks];
         void* outs[cuda_ipc::kMaxIpcRanks];
         for (int q = 0; q < c.size; ++q) {
           ins[q] = x.data() + q * count;
           outs[q] = y.data() + q * count;
         }
         cuda_ipc::all_to_all_ipc(c, int32_t(DType::F32), count, ins, outs, count * 4, nullptr);
       }},
      {"reduce",
       [](cuda_ipc::IpcComm& c, int, int64_t count) {
         std::vector<float> x(static_cast<size_t>(count), 1.0f), y(static_cast<size_t>(count));
         cuda_ipc::reduce_ipc(c, DType::F32, ReduceOp::SUM, x.data(), y.data(), count, 0, nullptr);
       }},
      {"reduce_scatter",
       [](cuda_ipc::IpcComm& c, int, int64_t count) {
         std::vector<float> x(static_cast<size_t>(count * c.size), 1.0f), y(static_cast<size_t>(count));
         const void* ins[cuda_ipc::kMaxIpcRanks];
         for (int q = 0; q < c.size; ++q) ins[q] = x.data() + q * count;
         cuda_ipc::reduce_scatter_ipc(c, DType::F32, ReduceOp::SUM, ins, y.data(), count, nullptr);
       }},
  };
  for (int64_t count : {int64_t(0), kChunk, 5 * kChunk + 100}) {
    for (const auto& [what, call] : calls) {
      auto run = [&, call = call](bool fused) {
        return count_call(n, [&](cuda_ipc::IpcComm& c, int r) {
          c.fused_collectives = fused;
          call(c, r, count);
        });
      };
      const Counted steps = run(false);
      record(what, n, count, steps);
      const Counted fused = run(true);
      std::string name = std::string(what) + ", fused kernel";
      g_names.push_back(name);
      record(g_names.back().c_str(), n, count, fused);
      char check[200];
      std::snprintf(check, sizeof(check), "fused %s n=%d count %ld: one launch, got %ld ops", what, n, long(count),
                    long(fused.rank0.total()));
      expect(fused.rank0.launches == 1 && fused.rank0.total() == 1, check);
      std::snprintf(check, sizeof(check), "fused %s n=%d count %ld: %ld bytes, step by step %ld", what, n,
                    long(count), long(fused.bytes_all), long(steps.bytes_all));
      expect(fused.bytes_all == steps.bytes_all, check);
    }
  }
}

// The list-op ring with every entry on one GPU (ring_by_segments): one
// launch per call, whatever the windows (it was n per window of n segments).
void ring_rows(int n) {
  const int64_t seg = 256;
  for (int64_t count : {seg * n, seg * n * 4, seg * n * 4 + 7}) {
    std::vector<std::vector<float>> data(static_cast<size_t>(n), std::vector<float>(static_cast<size_t>(count), 1.0f));
    std::vector<cuda_p2p::RingRank> ranks;
    for (int r = 0; r < n; ++r) ranks.push_back({0, nullptr, data[size_t(r)].data(), nullptr, nullptr});
    fake_cuda::stream_ops = {};
    expect(cuda_p2p::ring_allreduce({DType::F32, ReduceOp::SUM, count, seg, 16}, ranks) == cudaSuccess, "ring ran");
    Counted k{fake_cuda::stream_ops, fake_cuda::stream_ops.bytes};
    record("list ring, one GPU", n, count, k);
    expect(k.rank0.launches == 1 && k.rank0.total() == 1, "ring on one GPU: one launch");
    expect(k.bytes_all == 2 * n * count * 4, "ring: 2nN bytes");
  }
}

// A call made on its communicator's device switches nothing: no cudaSetDevice
// (the runtime call costs host time on every call at small sizes), for the
// step-by-step schedules, the fused kernels and send/recv alike. A thread on
// another device is switched and switched back.
void device_switches() {
  constexpr int n = 2;
  emulated::Arenas arenas(n, kSlot);
  std::barrier<> ready(n + 1), done(n + 1), counted(n + 1);
  std::vector<int> after(n, -1);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      cuda_ipc::IpcComm c = emulated::comm_for(arenas, r, kSlot);
      cudaSetDevice(c.device);
      ready.arrive_and_wait();
      std::vector<float> x(size_t(kChunk) * 3, 1.0f);
      for (bool fused : {false, true}) {
        c.fused_two_shot = c.fused_collectives = fused;
        cuda_ipc::allreduce_two_shot(c, DType::F32, ReduceOp::SUM, x.data(), x.data(), kChunk * 3, nullptr);
        cuda_ipc::broadcast_ipc(c, int32_t(DType::F32), kChunk, x.data(), kChunk * 4, 0, nullptr);
      }
      if (r == 0) cuda_ipc::send_ipc(c, x.data(), 64, 1, 7, nullptr);
      else cuda_ipc::recv_ipc(c, x.data(), 64, 0, 7, nullptr);
      uint32_t st = 1;
      cuda_ipc::read_status(c, nullptr, &st);
      expect(st == 0, "device switches: the calls succeeded");
      done.arrive_and_wait();
      counted.arrive_and_wait();
      // From another device: switched to the communicator's, then back.
      cudaSetDevice(c.device + 5);
      cuda_ipc::barrier_ipc(c, nullptr);
      cudaGetDevice(&after[size_t(r)]);
    });
  ready.arrive_and_wait();
  const int64_t before = fake_cuda::set_device_calls;
  done.arrive_and_wait();
  const int64_t switched = fake_cuda::set_device_calls - before;
  counted.arrive_and_wait();
  for (auto& t : threads) t.join();
  char what[160];
  std::snprintf(what, sizeof(what), "calls on their communicator's device: %ld cudaSetDevice calls", long(switched));
  expect(switched == 0, what);
  for (int r = 0; r < n; ++r) expect(after[size_t(r)] == r + 5, "a call from another device restores it");
}

// Counts of the collectives without a formula above, as measured on
// 2026-11-27 (the step-by-step schedules): launches per call on rank 0.
struct Expected {
  const char* what;
  int n;
  int64_t count;
  int64_t launches;
};

constexpr int64_t kSix = 5 * kChunk + 100;  // six chunks
const Expected kExpected[] = {
    // rank 0 is the root of broadcast and reduce
    {"broadcast", 2, kChunk, 2},       {"broadcast", 2, kSix, 12},       {"broadcast", 3, kChunk, 2},
    {"broadcast", 3, kSix, 12},        {"broadcast", 4, kChunk, 2},      {"broadcast", 4, kSix, 12},
    {"all_gather", 2, kChunk, 4},      {"all_gather", 2, kSix, 24},      {"all_gather", 3, kChunk, 5},
    {"all_gather", 3, kSix, 30},       {"all_gather", 4, kChunk, 6},     {"all_gather", 4, kSix, 36},
    {"reduce", 2, kChunk, 2},          {"reduce", 2, kSix, 12},          {"reduce", 3, kChunk, 2},
    {"reduce", 3, kSix, 12},           {"reduce", 4, kChunk, 2},         {"reduce", 4, kSix, 12},
    {"reduce_scatter", 2, kChunk, 6},  {"reduce_scatter", 2, kSix, 33},  {"reduce_scatter", 3, kChunk, 16},
    {"reduce_scatter", 3, kSix, 64},   {"reduce_scatter", 4, kChunk, 20}, {"reduce_scatter", 4, kSix, 105},
};

}  // namespace

int main() {
  cuda_kernels::g_blocks = 2;
  cuda_kernels::g_threads = 3;
  device_switches();
  for (int n = 2; n <= 4; ++n) {
    allreduce_rows(n);
    registered_rows(n);
    collective_rows(n);
    ring_rows(n);
  }
  std::printf("%-40s %2s %6s %8s %7s %6s %8s\n", "call", "n", "count", "launches", "memcpys", "events", "bytes/N");
  for (const Row& r : g_rows)
    std::printf("%-40s %2d %6ld %8ld %7ld %6ld %8ld\n", r.what, r.n, long(r.count), long(r.launches), long(r.memcpys),
                long(r.events), long(r.bytes_per_n));
  for (const Expected& e : kExpected) {
    bool found = false;
    for (const Row& r : g_rows) {
      if (std::strcmp(r.what, e.what) != 0 || r.n != e.n || r.count != e.count) continue;
      found = true;
      char what[200];
      std::snprintf(what, sizeof(what), "%s n=%d count %ld: %ld launches expected, got %ld", e.what, e.n,
                    long(e.count), long(e.launches), long(r.launches + r.memcpys + r.events));
      expect(r.launches + r.memcpys + r.events == e.launches, what);
    }
    expect(found, e.what);
  }
  std::printf("%ld checks, %ld failures\n", long(checks.load()), long(failures.load()));
  return failures == 0 ? 0 : 1;
}
