// The ring allreduce schedule (core/algorithms/ring_schedule.h) executed on GPUs of
// one process: rank r's work is enqueued on its own stream, and one event per
// rank carries the only cross-device dependency the schedule has, "rank r's
// step s reads what rank r-1 wrote at step s-1".
//
// Ordering argument. Before step g (counted across windows), every rank's
// stream waits for the event its left neighbour recorded after step g-1, so by
// induction rank r's step g starts after rank r-k finished step g-k, for every
// k <= g. That covers the read-after-write hazards (k = 1) and also every
// write-after-read one: rank r only overwrites memory rank r+1 reads at an
// earlier step, and r+1 = r-(n-1), so rank r's step g starts after rank r+1
// finished step g-(n-1):
//   * data[r] segment r is read by r+1 at step 0 (fold-first) and rewritten
//     by r at step n-1 (the first allgather copy);
//   * acc[r] (one window, reused by the next window) is read by r+1 at step
//     s+1 of window w and rewritten by r at step s of window w+1, S = 2(n-1)
//     steps later, and S - 1 >= n - 1.
// Nothing waits on more than its neighbour, so ranks drift up to n-1 steps
// apart and windows pipeline through the ring.
//
// All ranks on one stream (one GPU): no events; with n <= 8 ranks the result
// is computed by one launch of the rotated ring kernel or by one reduce launch
// per segment (RingOptions::one_launch; same bits, see ring_one_gpu.h and the
// .cpp), else the schedule runs in stream order.
//
// The caller orders the streams after whatever produced the data before the
// call and orders its consumers after every stream at the end (the ops layer's
// SideStreams does both).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "../../kernels/reduce_ops.h"

namespace fastpar {
namespace cuda_p2p {

struct RingRank {
  int device;
  cudaStream_t stream;  // a stream of `device`; all of this rank's work goes here
  void* data;           // `count` elements, reduced in place
  // min(window, count) accumulator elements on `device`; unused (may be
  // nullptr) when every rank shares one stream and n <= kMaxReducePtrs: that
  // case runs one launch of the rotated ring kernel (ring_by_segments).
  void* acc;
  // min(window, count) accumulator elements on `device` when this device has no
  // peer access to rank r-1's device (the partial is first copied here with
  // cudaMemcpyPeerAsync), nullptr when its kernels read rank r-1 directly.
  void* staging;
};

struct RingOptions {
  DType dtype;
  ReduceOp op;
  int64_t count;          // elements per rank
  int64_t segment_elems;  // a window is n segments
  int64_t align;          // segment boundaries are multiples of this many elements
  // Ranks on one stream (one GPU), n <= kMaxReducePtrs: true, one launch of the
  // rotated ring kernel (ring_one_gpu.h); false, one reduce launch per segment
  // (n per window), the form that ran on a GPU first. Same bits either way.
  bool one_launch = true;
};

// Bytes of one accumulator element (float for float16/bfloat16).
int ring_acc_bytes(DType dt);

// Enqueues the whole allreduce; returns the first CUDA error (the work already
// enqueued then is left as is: a CUDA error here means the context is unusable).
cudaError_t ring_allreduce(const RingOptions& opt, const std::vector<RingRank>& ranks);

}  // namespace cuda_p2p
}  // namespace fastpar
