// CUDA kernels for the reductions: the element math is reduce_ops.h, the same
// code the CPU loops run, so a GPU and a CPU reduction in the same order give
// the same bits. No torch here: the launchers (cuda_reduce.cu) are called by
// the torch glue and by the transports alike.
//
// Both kernels are grid-stride loops over 16-byte packs (uint4 loads and
// stores) when every pointer they touch is 16-byte aligned, then an exact
// scalar loop over the tail (and over everything when some pointer is not
// aligned: a view with an odd storage offset). A thread owns whole packs, so an
// element is read from every source before any destination is written: a
// destination may alias a source element for element (in-place allreduce).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_reduce_launch.h"
#include "reduce_ops.h"

namespace fastpar {
namespace cuda_kernels {

// Pointer arrays travel by value in the kernel parameters (no device-side
// table to allocate and copy). 8 covers one node's GPUs.
constexpr int kMaxPtrs = 8;

// 512 threads: enough loads in flight per SM for a bandwidth-bound kernel
// while leaving registers for the kMaxPtrs unrolled packs held per thread.
constexpr int kThreads = 512;

template <typename T>
struct ReducePtrs {
  const T* src[kMaxPtrs];
  T* dst[kMaxPtrs];
  int nsrc;
  int ndst;
  // When non-null and *guard != 0 the kernel does nothing: the multi-process
  // transports set it to their status word, so that after a failed flag phase
  // (timeout, peer abort) nothing reads peers' buffers or overwrites outputs.
  const uint32_t* guard;
};

// The guard's read. The word may be set while this kernel starts, by the
// rank's kernels on its other streams (a send or receive ring failing,
// p2p_ring.h, with a compare-and-swap), so the read is a strong one: volatile
// on the GPU (a relaxed load at system scope in PTX's memory model), a
// relaxed atomic in the host emulation, which ThreadSanitizer checks. A plain
// load would race with the compare-and-swap. Its value alone decides; it
// orders nothing.
__device__ __forceinline__ uint32_t read_guard(const uint32_t* g) {
#if defined(__CUDA_ARCH__)
  return *static_cast<const volatile uint32_t*>(g);
#else
  return __atomic_load_n(g, __ATOMIC_RELAXED);
#endif
}

// The kernel's typed view of a launch request. One conversion, used by the
// launcher and by the host emulation test, so the test runs what launches.
template <typename T>
ReducePtrs<T> reduce_ptrs(const ReduceLaunch& a) {
  ReducePtrs<T> p{};
  for (int s = 0; s < a.nsrc; ++s) p.src[s] = static_cast<const T*>(a.srcs[s]);
  for (int d = 0; d < a.ndst; ++d) p.dst[d] = static_cast<T*>(a.dsts[d]);
  p.nsrc = a.nsrc;
  p.ndst = a.ndst;
  p.guard = a.guard;
  return p;
}

// Elements of T in one 16-byte access.
template <typename T>
constexpr int vec_width() {
  return 16 / int(sizeof(T));
}

// N elements of E moved as whole 16-byte words (E = T or its accumulator).
template <typename E, int N>
struct Pack {
  static_assert((N * sizeof(E)) % 16 == 0, "a pack is a whole number of 16-byte words");
  static constexpr int kWords = int(N * sizeof(E) / 16);
  union {
    uint4 w[kWords];
    E e[N];
  };
};

template <typename E, int N>
__device__ __forceinline__ void load_words(const E* p, Pack<E, N>& pk) {
  const uint4* w = reinterpret_cast<const uint4*>(p);
#pragma unroll
  for (int k = 0; k < Pack<E, N>::kWords; ++k) pk.w[k] = w[k];
}

template <typename E, int N>
__device__ __forceinline__ void store_words(E* p, const Pack<E, N>& pk) {
  uint4* w = reinterpret_cast<uint4*>(p);
#pragma unroll
  for (int k = 0; k < Pack<E, N>::kWords; ++k) w[k] = pk.w[k];
}

// dst[d][i] = finalize(src[0][i] (+) src[1][i] (+) ... (+) src[nsrc-1][i]) for
// every d, in that order for every element (what makes results reproducible).
// The source loop is unrolled to kMaxPtrs with a guard so that all nsrc loads
// of a pack are issued before the first combine waits on one: peer reads over
// NVLink have microsecond latency, and a load-combine-load chain would expose
// it nsrc times.
template <typename T, ReduceOp OP>
__global__ void __launch_bounds__(kThreads)
    reduce_kernel(ReducePtrs<T> p, int64_t count, int contributions, bool vec) {
  using A = acc_t<T>;
  constexpr int V = vec_width<T>();
  if (p.guard && read_guard(p.guard) != 0) return;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t scalar_begin = 0;
  if (vec) {
    const int64_t npacks = count / V;
    for (int64_t v = tid; v < npacks; v += stride) {
      const int64_t off = v * V;
      // Sources stay packed (4 registers each) until combined: unpacked 1-byte
      // elements would need 8 x 16 registers and spill.
      Pack<T, V> x[kMaxPtrs];
#pragma unroll
      for (int s = 0; s < kMaxPtrs; ++s)
        if (s < p.nsrc) load_words(p.src[s] + off, x[s]);
      A acc[V];
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] = load_acc(x[0].e[i]);
#pragma unroll
      for (int s = 1; s < kMaxPtrs; ++s)
        if (s < p.nsrc) {
#pragma unroll
          for (int i = 0; i < V; ++i) acc[i] = combine<OP>(acc[i], load_acc(x[s].e[i]));
        }
      Pack<T, V> y;
#pragma unroll
      for (int i = 0; i < V; ++i) y.e[i] = store_acc<T>(finalize<OP>(acc[i], contributions));
#pragma unroll
      for (int d = 0; d < kMaxPtrs; ++d)
        if (d < p.ndst) store_words(p.dst[d] + off, y);
    }
    scalar_begin = npacks * V;
  }
  for (int64_t i = scalar_begin + tid; i < count; i += stride) {
    T x[kMaxPtrs];
#pragma unroll
    for (int s = 0; s < kMaxPtrs; ++s)
      if (s < p.nsrc) x[s] = p.src[s][i];
    A acc = load_acc(x[0]);
#pragma unroll
    for (int s = 1; s < kMaxPtrs; ++s)
      if (s < p.nsrc) acc = combine<OP>(acc, load_acc(x[s]));
    const T y = store_acc<T>(finalize<OP>(acc, contributions));
#pragma unroll
    for (int d = 0; d < kMaxPtrs; ++d)
      if (d < p.ndst) p.dst[d][i] = y;
  }
}

// One ring step on one segment, element for element the CPU's
// cpu_accumulate_range (kFinish = false) and cpu_finish_range (kFinish = true):
//   a = prev_acc ? prev_acc[i] : load_acc(prev_data[i]);
//   r = a (+) mine[i];
//   fold:   out_acc[i] = r                      (kept in acc_t: fp32 for 16-bit floats)
//   finish: out[i]     = store(finalize(r))
// `prev_acc` being null or not is uniform across the grid, so the branch costs
// nothing and halves the number of instantiated kernels.
template <typename T, ReduceOp OP, bool kFinish>
__global__ void __launch_bounds__(kThreads)
    ring_step_kernel(const acc_t<T>* prev_acc, const T* prev_data, const T* mine, acc_t<T>* out_acc,
                     T* out, int64_t count, int contributions, bool vec) {
  using A = acc_t<T>;
  constexpr int V = vec_width<T>();
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t scalar_begin = 0;
  if (vec) {
    const int64_t npacks = count / V;
    // Not unrolled by the compiler: its unrolled loop divides the trip count
    // by the 64-bit stride, a call into a subroutine that costs the 16-bit
    // float folds a stack frame on sm_80, for no loads moved earlier (a store
    // may alias the next pack's loads).
#pragma unroll 1
    for (int64_t v = tid; v < npacks; v += stride) {
      const int64_t off = v * V;
      Pack<A, V> a;  // V * sizeof(A) is 16 or 32 bytes: whole words
      if (prev_acc) {
        load_words(prev_acc + off, a);
      } else {
        Pack<T, V> pd;
        load_words(prev_data + off, pd);
#pragma unroll
        for (int i = 0; i < V; ++i) a.e[i] = load_acc(pd.e[i]);
      }
      Pack<T, V> m;
      load_words(mine + off, m);
#pragma unroll
      for (int i = 0; i < V; ++i) a.e[i] = combine<OP>(a.e[i], load_acc(m.e[i]));
      if constexpr (kFinish) {
        Pack<T, V> y;
#pragma unroll
        for (int i = 0; i < V; ++i) y.e[i] = store_acc<T>(finalize<OP>(a.e[i], contributions));
        store_words(out + off, y);
      } else {
        store_words(out_acc + off, a);
      }
    }
    scalar_begin = npacks * V;
  }
  for (int64_t i = scalar_begin + tid; i < count; i += stride) {
    const A a = prev_acc ? prev_acc[i] : load_acc(prev_data[i]);
    const A r = combine<OP>(a, load_acc(mine[i]));
    if constexpr (kFinish) {
      out[i] = store_acc<T>(finalize<OP>(r, contributions));
    } else {
      out_acc[i] = r;
    }
  }
}

}  // namespace cuda_kernels
}  // namespace fastpar
