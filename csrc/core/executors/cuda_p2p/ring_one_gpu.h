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
  int64_t align;    // RingOptions::align
  bool vec;         // every entry 16-byte aligned and align * element size a multiple of 16
};

// Segment j of the window starting at wbegin: [*b, *e), split_range's cut.
FASTPAR_HD void rotated_segment(const RotatedRingArgs& a, int64_t wbegin, int j, int64_t* b, int64_t* e) {
  const int64_t window = a.segment * a.n;
  const int64_t wend = wbegin + window < a.count ? wbegin + window : a.count;
  int64_t per = (wend - wbegin + a.n - 1) / a.n;
  per = (per + a.align - 1) / a.align * a.align;
  const int64_t lo = wbegin + per * j;
  *b = lo < wend ? lo : wend;
  *e = lo + per < wend ? lo + per : wend;
}

#if defined(__CUDA_ARCH__)
#define FASTPAR_RR_UNROLL _Pragma("unroll")
#else
#define FASTPAR_RR_UNROLL
#endif

// Thread `t` of `nt` in the whole grid: every segment of every window, the
// segment's packs (or elements) grid-strided. The rotated sources are set
// once per segment, so the inner loop indexes them with compile-time indices.
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
    for (int j = 0; j < n; ++j) {
      int64_t b, e;
      rotated_segment(a, wbegin, j, &b, &e);
      if (b >= e) continue;
      T* src[NMAX];
      FASTPAR_RR_UNROLL
      for (int s = 0; s < NMAX; ++s) {
        int q = j + s;
        if (q >= n) q -= n;
        src[s] = s < n ? static_cast<T*>(a.data[q]) + b : nullptr;
      }
      const int64_t len = e - b;
      int64_t tail = 0;
      if (a.vec) {
        const int64_t packs = len / V;
        for (int64_t v = t; v < packs; v += nt) {
          Pack x[NMAX];
          FASTPAR_RR_UNROLL
          for (int s = 0; s < NMAX; ++s)
            if (s < n) x[s].w = reinterpret_cast<const uint4*>(src[s])[v];
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
            if (s < n) reinterpret_cast<uint4*>(src[s])[v] = y.w;
        }
        tail = packs * V;
      }
      for (int64_t i = tail + t; i < len; i += nt) {
        T x[NMAX];
        FASTPAR_RR_UNROLL
        for (int s = 0; s < NMAX; ++s)
          if (s < n) x[s] = src[s][i];
        A acc = load_acc(x[0]);
        FASTPAR_RR_UNROLL
        for (int s = 1; s < NMAX; ++s)
          if (s < n) acc = combine<OP>(acc, load_acc(x[s]));
        const T y = store_acc<T>(finalize<OP>(acc, n));
        FASTPAR_RR_UNROLL
        for (int s = 0; s < NMAX; ++s)
          if (s < n) src[s][i] = y;
      }
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
