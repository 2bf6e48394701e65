// The list-op ring's result when every entry is on one GPU, in ONE launch per
// call (ring_allreduce.cpp used n reduce launches per window of n segments).
// The ring schedule folds segment j of a window starting from entry j, then
// j+1, ..., j+n-1 (mod n), in the accumulator type, and finalizes once; this
// kernel does exactly that for every segment of every window, each thread
// reading element i (or its 16-byte pack) of all n entries before writing it
// to all of them, so the bits are the ring's (and the CPU ring's), and the
// entries, sources and destinations at once, need no accumulator buffers.
// Segments are cut as the ring cuts them (ring_schedule.h's split_range with
// RingOptions::align), so a 16-byte pack never straddles two segments when
// align * the element size is a multiple of 16 (the caller checks).
// Written once for the kernel (ring_one_gpu.cu) and the host emulation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "../../kernels/cuda_reduce_launch.h"  // kMaxReducePtrs
#include "../../kernels/reduce_ops.h"

namespace fastpar {
namespace cuda_p2p {

struct RotatedRingArgs {
  void* data[cuda_kernels::kMaxReducePtrs];  // the n entries, reduced in place
  int n;
  int64_t count;    // elements per entry
  int64_t segment;  // RingOptions::segment_elems: a window is n segments
  int64_t align;    // RingOptions::align, below 2^32
  bool vec;         // every entry 16-byte aligned and align * element size a multiple of 16
};

// The segment length of the window starting at wbegin (split_range's cut):
// segment j is [wbegin + per * j, wbegin + per * (j + 1)), clamped to the
// window's end `*wend`. In 32-bit divisions (reduce_ops.h's udiv64_by_32):
// n and align fit 32 bits (the launcher checks).
FASTPAR_HD int64_t rotated_per(const RotatedRingArgs& a, int64_t wbegin, int64_t* wend) {
  const int64_t window = a.segment * a.n;
  *wend = wbegin + window < a.count ? wbegin + window : a.count;
  const int64_t per = int64_t(udiv64_by_32(uint64_t(*wend - wbegin + a.n - 1), uint32_t(a.n)));
  return int64_t(udiv64_by_32(uint64_t(per + a.align - 1), uint32_t(a.align))) * a.align;
}

#if defined(__CUDA_ARCH__)
#define FASTPAR_RR_UNROLL _Pragma("unroll")
#else
#define FASTPAR_RR_UNROLL
#endif

// The segment j of the window holding offset `off`, for offsets that only
// grow (one thread's grid-stride walk over a window): the boundaries are
// stepped over, not divided by (on the GPU a 64-bit division is a call into a
// subroutine, and the registers held across it cost a stack frame).
struct RotatedSegment {
  int64_t per;
  int last;  // n - 1
  int j = 0;
  int64_t next = per;  // where segment j + 1 starts
  FASTPAR_HD int at(int64_t off) {
    while (j < last && off >= next) {
      ++j;
      next += per;
    }
    return j;
  }
};

// Thread `t` of `nt` in the whole grid: the packs (or elements) of each
// window, grid-strided over the whole window rather than segment by segment,
// so a small segment does not leave most threads idle. Each pack finds its
// segment j and folds the entries from j onwards; a pack never straddles two
// segments (the header's alignment), and the scalar tail lies in the last one.
template <typename T, ReduceOp OP>
FASTPAR_HD void rotated_ring(const RotatedRingArgs& a, int64_t t, int64_t nt) {
  using A = acc_t<T>;
  constexpr int NMAX = cuda_kernels::kMaxReducePtrs;
  constexpr int V = 16 / int(sizeof(T));
  union Pack {
    uint4 w;
    T e[V];
  };
  const int n = a.n;
  const int64_t window = a.segment * n;
  for (int64_t wbegin = 0; wbegin < a.count; wbegin += window) {
    int64_t wend = 0;
    const int64_t per = rotated_per(a, wbegin, &wend);
    const int64_t len = wend - wbegin;
    int64_t tail = 0;
    if (a.vec) {
      const int64_t packs = len / V;
      RotatedSegment seg{per, n - 1};
      for (int64_t v = t; v < packs; v += nt) {
        const int64_t pos = wbegin + v * V;
        const int j = seg.at(v * V);
        Pack x[NMAX];
        FASTPAR_RR_UNROLL
        for (int s = 0; s < NMAX; ++s) {
          int q = j + s;
          if (q >= n) q -= n;
          if (s < n) x[s].w = *reinterpret_cast<const uint4*>(static_cast<const T*>(a.data[q]) + pos);
        }
        Pack y;
        FASTPAR_RR_UNROLL
        for (int k = 0; k < V; ++k) {
          A acc = load_acc(x[0].e[k]);
          FASTPAR_RR_UNROLL
          for (int s = 1; s < NMAX; ++s)
            if (s < n) acc = combine<OP>(acc, load_acc(x[s].e[k]));
          y.e[k] = store_acc<T>(finalize<OP>(acc, n));
        }
        FASTPAR_RR_UNROLL
        for (int s = 0; s < NMAX; ++s)
          if (s < n) *reinterpret_cast<uint4*>(static_cast<T*>(a.data[s]) + pos) = y.w;
      }
      tail = packs * V;
    }
    RotatedSegment seg{per, n - 1};
    for (int64_t i = tail + t; i < len; i += nt) {
      const int64_t pos = wbegin + i;
      const int j = seg.at(i);
      T x[NMAX];
      FASTPAR_RR_UNROLL
      for (int s = 0; s < NMAX; ++s) {
        int q = j + s;
        if (q >= n) q -= n;
        if (s < n) x[s] = static_cast<const T*>(a.data[q])[pos];
      }
      A acc = load_acc(x[0]);
      FASTPAR_RR_UNROLL
      for (int s = 1; s < NMAX; ++s)
        if (s < n) acc = combine<OP>(acc, load_acc(x[s]));
      const T y = store_acc<T>(finalize<OP>(acc, n));
      FASTPAR_RR_UNROLL
      for (int s = 0; s < NMAX; ++s)
        if (s < n) static_cast<T*>(a.data[s])[pos] = y;
    }
  }
}

#undef FASTPAR_RR_UNROLL

// Enqueues the kernel (ring_one_gpu.cu) on `stream`, the grid capped at the
// blocks per SM its registers allow (the occupancy API, asked once per
// instance) times the SMs.
cudaError_t launch_rotated_ring(DType dt, ReduceOp op, const RotatedRingArgs& a, cudaStream_t stream);

}  // namespace cuda_p2p
}  // namespace fastpar
