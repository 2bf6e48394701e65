#include "ring_allreduce.h"

#include <algorithm>

#include "../../algorithms/ring_schedule.h"
#include "../../kernels/cuda_reduce_launch.h"
#include "../../transport/cuda_p2p/cuda_try.h"
#include "../../transport/cuda_p2p/handle_cache.h"
#include "../../transport/cuda_p2p/peer_copy.h"
#include "ring_one_gpu.h"

namespace fastpar {
namespace cuda_p2p {
namespace {

char* at_elem(void* base, int64_t index, int64_t elem_bytes) {
  return static_cast<char*>(base) + index * elem_bytes;
}

// The partial rank `me` folds in at this step: rank src's data (still T) or
// accumulator, read in place over peer access or first copied into my staging
// buffer. `offset` is the element offset inside the window (acc and staging
// buffers hold one window).
cudaError_t partial_source(const RingRank& me, const RingRank& src, bool from_data, int64_t data_index,
                           int64_t offset, int64_t len, int64_t ts, int64_t as, const void** prev) {
  const int64_t eb = from_data ? ts : as;
  const void* remote = from_data ? at_elem(src.data, data_index, ts) : at_elem(src.acc, offset, as);
  if (!me.staging) {
    *prev = remote;
    return cudaSuccess;
  }
  void* local = at_elem(me.staging, offset, eb);
  FASTPAR_CUDA_TRY(peer_copy(local, me.device, remote, src.device, size_t(len * eb), me.stream));
  *prev = local;
  return cudaSuccess;
}

cudaError_t run_step(const RingOptions& opt, const std::vector<RingRank>& ranks, const RingStep& st,
                     int64_t wbegin, const Range& seg, int64_t ts, int64_t as) {
  const int n = int(ranks.size());
  const RingRank& me = ranks[size_t(st.dst)];
  const RingRank& src = ranks[size_t(st.src)];
  const int64_t offset = seg.begin - wbegin;
  const int64_t len = seg.size();
  void* mine = at_elem(me.data, seg.begin, ts);
  const void* prev = nullptr;
  switch (st.action) {
    case RingAction::kFoldFirst:
      FASTPAR_CUDA_TRY(partial_source(me, src, true, seg.begin, offset, len, ts, as, &prev));
      return cuda_kernels::launch_ring_fold(opt.dtype, opt.op, nullptr, prev, mine,
                                            at_elem(me.acc, offset, as), len, me.stream);
    case RingAction::kFold:
      FASTPAR_CUDA_TRY(partial_source(me, src, false, seg.begin, offset, len, ts, as, &prev));
      return cuda_kernels::launch_ring_fold(opt.dtype, opt.op, prev, nullptr, mine,
                                            at_elem(me.acc, offset, as), len, me.stream);
    case RingAction::kFinish:
      FASTPAR_CUDA_TRY(partial_source(me, src, st.src_is_data, seg.begin, offset, len, ts, as, &prev));
      return cuda_kernels::launch_ring_finish(opt.dtype, opt.op, st.src_is_data ? nullptr : prev,
                                              st.src_is_data ? prev : nullptr, mine, mine, len, n,
                                              me.stream);
    case RingAction::kCopy:
      return peer_copy(mine, me.device, at_elem(src.data, seg.begin, ts), src.device, size_t(len * ts),
                       me.stream);
  }
  return cudaErrorInvalidValue;
}

// The ring's result computed segment by segment, for ranks that share one
// stream (one GPU) and n <= kMaxReducePtrs. The schedule folds segment j of a
// window starting from rank j's data, then ranks j+1, ..., j+n-1 (mod n), in
// the accumulator type, and finalizes once: exactly what reduce_kernel does
// with its sources in that rotated order. So one launch per segment, writing
// all n ranks, gives the schedule's bits (and the CPU ring's) with n launches
// per window instead of 2(n-1) launches and copies per rank, and no
// accumulator buffers. Every destination is also a source at the same offset,
// which the kernel allows (each element is read from every source first).
cudaError_t ring_launch_per_segment(const RingOptions& opt, const std::vector<RingRank>& ranks) {
  const int n = int(ranks.size());
  const int64_t ts = dtype_size(opt.dtype);
  const int64_t window = opt.segment_elems * n;
  FASTPAR_CUDA_TRY(cudaSetDevice(ranks[0].device));
  for (int64_t w = 0; w < num_windows(opt.count, window); ++w) {
    const int64_t wbegin = w * window;
    const int64_t wend = std::min(opt.count, wbegin + window);
    for (int j = 0; j < n; ++j) {
      const Range seg = split_range(wbegin, wend, n, j, opt.align);
      if (seg.size() == 0) continue;
      cuda_kernels::ReduceLaunch a;
      for (int i = 0; i < n; ++i) {
        a.srcs[i] = at_elem(ranks[size_t(ring_mod(j + i, n))].data, seg.begin, ts);
        a.dsts[i] = at_elem(ranks[size_t(i)].data, seg.begin, ts);
      }
      a.nsrc = a.ndst = n;
      a.count = seg.size();
      a.contributions = n;
      FASTPAR_CUDA_TRY(cuda_kernels::launch_reduce(opt.dtype, opt.op, a, ranks[0].stream));
    }
  }
  return cudaSuccess;
}

// The same result in ONE launch of the rotated ring kernel (ring_one_gpu.h),
// which walks every segment of every window with its sources in that rotated
// order itself: no accumulator buffers, no events, one stream operation.
cudaError_t ring_one_launch(const RingOptions& opt, const std::vector<RingRank>& ranks) {
  const int n = int(ranks.size());
  const int64_t ts = dtype_size(opt.dtype);
  RotatedRingArgs a{};
  bool vec = (opt.align * ts) % 16 == 0 && (opt.segment_elems * n * ts) % 16 == 0;
  for (int i = 0; i < n; ++i) {
    a.data[i] = ranks[size_t(i)].data;
    vec = vec && (reinterpret_cast<uintptr_t>(a.data[i]) & 15u) == 0;
  }
  a.n = n;
  a.count = opt.count;
  a.segment = opt.segment_elems;
  a.align = opt.align;
  a.vec = vec;
  FASTPAR_CUDA_TRY(cudaSetDevice(ranks[0].device));
  return launch_rotated_ring(opt.dtype, opt.op, a, ranks[0].stream);
}

}  // namespace

int ring_acc_bytes(DType dt) {
  int bytes = 0;
  FASTPAR_DISPATCH_DTYPE(dt, [&] { bytes = int(sizeof(acc_t<scalar_t>)); });
  return bytes;
}

cudaError_t ring_allreduce(const RingOptions& opt, const std::vector<RingRank>& ranks) {
  const int n = int(ranks.size());
  if (n <= 1 || opt.count == 0) return cudaSuccess;  // one rank: op over x alone is x
  const int64_t ts = dtype_size(opt.dtype);
  const int64_t as = ring_acc_bytes(opt.dtype);
  const int64_t window = opt.segment_elems * n;
  DeviceRestore restore;
  // Every rank on one stream (all entries on one GPU): the stream executes the
  // steps in the order they are enqueued here, step by step and rank by rank
  // inside a step, and that serial order already satisfies every hazard the
  // events below exist for (each step reads only what earlier steps wrote, and
  // a rank's step writes a segment no later rank reads in the same step). So
  // no events at all; the host emulation test runs exactly this order.
  bool one_stream = true;
  for (const RingRank& r : ranks) one_stream = one_stream && r.stream == ranks[0].stream && r.device == ranks[0].device;
  if (one_stream && n <= cuda_kernels::kMaxReducePtrs)
    return opt.one_launch ? ring_one_launch(opt, ranks) : ring_launch_per_segment(opt, ranks);
  // One stream but more ranks than reduce_kernel reads: the schedule itself,
  // in stream order (no events).
  // One event per rank (on its device), from the process-wide cache.
  CallEvents events;
  if (!one_stream)
    for (const RingRank& r : ranks) FASTPAR_CUDA_TRY(events.take(r.device));
  if (one_stream) FASTPAR_CUDA_TRY(cudaSetDevice(ranks[0].device));
  bool first = true;
  for (int64_t w = 0; w < num_windows(opt.count, window); ++w) {
    const int64_t wbegin = w * window;
    const int64_t wend = std::min(opt.count, wbegin + window);
    for (int step = 0; step < ring_num_steps(n); ++step) {
      // All waits of this step are enqueued before any record of it: a wait
      // binds to the event's latest record at the time of the call, which must
      // be the neighbour's previous step.
      if (!first && !one_stream) {
        for (int r = 0; r < n; ++r) {
          FASTPAR_CUDA_TRY(cudaSetDevice(ranks[size_t(r)].device));
          FASTPAR_CUDA_TRY(cudaStreamWaitEvent(ranks[size_t(r)].stream, events[size_t(ring_mod(r - 1, n))], 0));
        }
      }
      first = false;
      for (int r = 0; r < n; ++r) {
        if (!one_stream) FASTPAR_CUDA_TRY(cudaSetDevice(ranks[size_t(r)].device));
        const RingStep st = ring_step(n, step, r);
        const Range seg = split_range(wbegin, wend, n, st.segment, opt.align);
        if (seg.size() > 0) FASTPAR_CUDA_TRY(run_step(opt, ranks, st, wbegin, seg, ts, as));
        // Recorded even after an empty segment: the neighbour's next step waits on it.
        if (!one_stream) FASTPAR_CUDA_TRY(cudaEventRecord(events[size_t(r)], ranks[size_t(r)].stream));
      }
    }
  }
  return cudaSuccess;
}

}  // namespace cuda_p2p
}  // namespace fastpar
