// CPU, one process: every "rank" is a separate buffer in this address space,
// so a transfer is a load. This transport executes the schedules with a
// caller-supplied parallel-for (at::parallel_for in the extension, a serial
// loop in the C++ tests) and the element loops of core/kernels/cpu_reduce.h.
//
//   ParallelFor: void(int64_t begin, int64_t end, int64_t grain,
//                     const std::function<void(int64_t, int64_t)>& body)
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include "../../algorithms/ring_schedule.h"
#include "../../kernels/cpu_reduce.h"

namespace fastpar {
namespace cpu_local {

// Elements per parallel task: large enough to amortize a task (~64 KiB of
// float32 per source), small enough to balance 2-64 threads on MiB tensors.
constexpr int64_t kGrain = 16384;

// Outputs (all destinations together) at least as large as the last-level
// cache bypass it with non-temporal stores: past that, plain stores cost an
// extra read per line, and below it the outputs stay cached for the next op
// (both sides measured: docs/measurements.md). The L3 size comes from sysfs
// (as lscpu reads it); sysconf's answer is unreliable in VMs.
inline int64_t streaming_threshold_bytes() {
  static const int64_t bytes = [] {
    int64_t kib = 0;
    if (FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r")) {
      long long v = 0;
      char unit = 'K';
      if (std::fscanf(f, "%lld%c", &v, &unit) >= 1) kib = unit == 'M' ? v * 1024 : v;
      std::fclose(f);
    }
    return kib > 0 ? kib * 1024 : int64_t(32) << 20;
  }();
  return bytes;
}

using ParallelFor = std::function<void(int64_t, int64_t, int64_t,
                                       const std::function<void(int64_t, int64_t)>&)>;

// Direct (one-pass) reduce: dsts[d][i] = op over s of srcs[s][i], i in [0, count).
// This is allreduce when dsts == srcs, reduce when dsts = {root}, and one
// reduce-scatter shard when srcs point at that shard of every input.
template <typename T, ReduceOp OP>
void reduce_direct(const ParallelFor& pf, const std::vector<const T*>& srcs,
                   const std::vector<T*>& dsts, int64_t count, int contributions) {
  const bool streaming = count * int64_t(sizeof(T)) * int64_t(dsts.size()) >= streaming_threshold_bytes();
  // Parallelize over whole tasks of kGrain elements so every task starts
  // vector-aligned (when the tensors do), whatever split the thread pool picks.
  const int64_t tasks = (count + kGrain - 1) / kGrain;
  pf(0, tasks, 1, [&](int64_t tb, int64_t te) {
    cpu_reduce_range<T, OP>(srcs.data(), int(srcs.size()), dsts.data(), int(dsts.size()), tb * kGrain,
                            std::min(count, te * kGrain), contributions, streaming);
  });
}

// In-place ring allreduce over data[0..n-1], windows of n * segment_elems.
// Steps run one after another (each is a barrier across ranks); inside a step
// all ranks' transfers and their element ranges run in parallel.
template <typename T, ReduceOp OP>
void allreduce_ring(const ParallelFor& pf, const std::vector<T*>& data, int64_t count,
                    int64_t segment_elems, int64_t align) {
  using A = acc_t<T>;
  const int n = int(data.size());
  if (n <= 1 || count == 0) return;  // one rank: SUM/MIN/MAX/PRODUCT/AVG of x alone is x
  const int64_t window = segment_elems * n;
  std::vector<std::vector<A>> acc(n, std::vector<A>(size_t(std::min(window, count))));
  for (int64_t w = 0; w < num_windows(count, window); ++w) {
    const int64_t wbegin = w * window;
    const int64_t wend = std::min(count, wbegin + window);
    for (int step = 0; step < ring_num_steps(n); ++step) {
      // Flatten (rank, element) into one index space so both parallelize.
      const int64_t span = std::min(window, count);
      pf(0, int64_t(n) * span, kGrain, [&](int64_t b, int64_t e) {
        for (int64_t x = b; x < e;) {
          const int dst = int(x / span);
          const int64_t row_end = std::min(e, int64_t(dst + 1) * span);
          const RingStep st = ring_step(n, step, dst);
          const Range seg = split_range(wbegin, wend, n, st.segment, align);
          const int64_t lo = std::max(seg.begin, wbegin + (x - int64_t(dst) * span));
          const int64_t hi = std::min(seg.end, wbegin + (row_end - int64_t(dst) * span));
          x = row_end;
          if (lo >= hi) continue;
          const int64_t a0 = lo - wbegin, a1 = hi - wbegin;  // offsets in the acc buffers
          switch (st.action) {
            case RingAction::kFoldFirst:
              cpu_accumulate_range<T, OP>(nullptr, data[st.src] + wbegin, data[dst] + wbegin,
                                          acc[dst].data(), a0, a1);
              break;
            case RingAction::kFold:
              cpu_accumulate_range<T, OP>(acc[st.src].data(), nullptr, data[dst] + wbegin,
                                          acc[dst].data(), a0, a1);
              break;
            case RingAction::kFinish:
              cpu_finish_range<T, OP>(st.src_is_data ? nullptr : acc[st.src].data(),
                                      data[st.src] + wbegin, data[dst] + wbegin,
                                      data[dst] + wbegin, a0, a1, n);
              break;
            case RingAction::kCopy:
              for (int64_t i = a0; i < a1; ++i) data[dst][wbegin + i] = data[st.src][wbegin + i];
              break;
          }
        }
      });
    }
  }
}

}  // namespace cpu_local
}  // namespace fastpar
