// The data loops of the one-kernel collectives (ipc_fused_two_shot.h,
// ipc_fused_collectives.h): a copy and an in-order reduction over one block's
// threads, in 16-byte packs with several packs in flight per thread, and an
// exact scalar loop for what is not whole packs or not 16-byte aligned.
// Host and device: the host emulation runs them thread by thread.
#pragma once

#include <cstdint>

#include "../../kernels/reduce_ops.h"
#include "../../transport/cuda_ipc/ipc_arena.h"

namespace fastpar {
namespace cuda_ipc {

FASTPAR_HD bool fused_aligned(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

#if defined(__CUDA_ARCH__)
#define FASTPAR_FUSED_UNROLL _Pragma("unroll")
#else
#define FASTPAR_FUSED_UNROLL
#endif

// Packs in flight per thread in the copies (fused_copy): 4 x 16 bytes, so a
// warp has 2 KiB of loads outstanding instead of 512 bytes.
constexpr int kFusedCopyUnroll = 4;

// dst[0, n) = src[0, n) (T elements), thread t of nt: kFusedCopyUnroll packs
// loaded before any is stored, then the rest pack by pack, then the scalar
// tail. The buffers never overlap, or are the same (a copy onto itself).
template <typename T>
FASTPAR_HD void fused_copy(T* dst, const T* src, int64_t n, int t, int nt) {
  constexpr int64_t V = 16 / int64_t(sizeof(T));
  constexpr int U = kFusedCopyUnroll;
  int64_t tail = 0;
  if (fused_aligned(dst) && fused_aligned(src)) {
    const int64_t packs = n / V;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    int64_t v = t;
    for (; v + int64_t(U - 1) * nt < packs; v += int64_t(U) * nt) {
      uint4 x[U];
      FASTPAR_FUSED_UNROLL
      for (int u = 0; u < U; ++u) x[u] = s[v + int64_t(u) * nt];
      FASTPAR_FUSED_UNROLL
      for (int u = 0; u < U; ++u) d[v + int64_t(u) * nt] = x[u];
    }
    for (; v < packs; v += nt) d[v] = s[v];
    tail = packs * V;
  }
  for (int64_t i = tail + t; i < n; i += nt) dst[i] = src[i];
}

// dst[d][0, len) = op over src[0 .. n) in rank order, for each of the nd <= ND
// destinations, in the accumulator type (reduce_ops.h, as the reduce kernel:
// the same bits), AVG dividing by `contributions`. U packs per thread per
// iteration, each with its n source loads issued before any combine, so U * n
// loads are in flight. NMAX bounds n at compile time: the source arrays stay
// in registers.
template <typename T, ReduceOp OP, int NMAX>
struct FusedReduce {
  using A = acc_t<T>;
  static constexpr int V = 16 / int(sizeof(T));
  union Pack {
    uint4 w;
    T e[V];
  };

  template <int U, int ND>
  static FASTPAR_HD void run(const T* const* src, int n, T* const* dst, int nd, int64_t len, int contributions,
                             int t, int nt) {
    bool vec = true;
    FASTPAR_FUSED_UNROLL
    for (int d = 0; d < ND; ++d)
      if (d < nd) vec = vec && fused_aligned(dst[d]);
    FASTPAR_FUSED_UNROLL
    for (int q = 0; q < NMAX; ++q)
      if (q < n) vec = vec && fused_aligned(src[q]);
    int64_t tail = 0;
    if (vec) {
      const int64_t packs = len / V;
      int64_t v = t;
      for (; v + int64_t(U - 1) * nt < packs; v += int64_t(U) * nt) {
        Pack x[U][NMAX];
        FASTPAR_FUSED_UNROLL
        for (int u = 0; u < U; ++u) {
          FASTPAR_FUSED_UNROLL
          for (int q = 0; q < NMAX; ++q)
            if (q < n) x[u][q].w = reinterpret_cast<const uint4*>(src[q])[v + int64_t(u) * nt];
        }
        FASTPAR_FUSED_UNROLL
        for (int u = 0; u < U; ++u) {
          const uint4 y = combine_pack(x[u], n, contributions);
          FASTPAR_FUSED_UNROLL
          for (int d = 0; d < ND; ++d)
            if (d < nd) reinterpret_cast<uint4*>(dst[d])[v + int64_t(u) * nt] = y;
        }
      }
      for (; v < packs; v += nt) {
        Pack x[NMAX];
        FASTPAR_FUSED_UNROLL
        for (int q = 0; q < NMAX; ++q)
          if (q < n) x[q].w = reinterpret_cast<const uint4*>(src[q])[v];
        const uint4 y = combine_pack(x, n, contributions);
        FASTPAR_FUSED_UNROLL
        for (int d = 0; d < ND; ++d)
          if (d < nd) reinterpret_cast<uint4*>(dst[d])[v] = y;
      }
      tail = packs * V;
    }
    for (int64_t i = tail + t; i < len; i += nt) {
      T x[NMAX];
      FASTPAR_FUSED_UNROLL
      for (int q = 0; q < NMAX; ++q)
        if (q < n) x[q] = src[q][i];
      A acc = load_acc(x[0]);
      FASTPAR_FUSED_UNROLL
      for (int q = 1; q < NMAX; ++q)
        if (q < n) acc = combine<OP>(acc, load_acc(x[q]));
      const T y = store_acc<T>(finalize<OP>(acc, contributions));
      FASTPAR_FUSED_UNROLL
      for (int d = 0; d < ND; ++d)
        if (d < nd) dst[d][i] = y;
    }
  }

 private:
  // One output pack from the sources' packs x[0 .. n), element by element.
  static FASTPAR_HD uint4 combine_pack(const Pack* x, int n, int contributions) {
    Pack y;
    FASTPAR_FUSED_UNROLL
    for (int e = 0; e < V; ++e) {
      A acc = load_acc(x[0].e[e]);
      FASTPAR_FUSED_UNROLL
      for (int q = 1; q < NMAX; ++q)
        if (q < n) acc = combine<OP>(acc, load_acc(x[q].e[e]));
      y.e[e] = store_acc<T>(finalize<OP>(acc, contributions));
    }
    return y.w;
  }
};

// The rank bound a call's reducing kernel is compiled for (FusedReduce's
// NMAX): up to 4 ranks, 2 packs per thread in flight in the reduction (2n >= 4
// loads); more ranks, 1 pack (n >= 5 loads). Both in one kernel would share
// one register allocation and spill (ptxas); apart, each fits 128 registers.
FASTPAR_HD int fused_rank_bound(int n) { return n <= 4 ? 4 : kMaxIpcRanks; }

// Packs per thread per iteration of the reduction for rank bound NMAX (a
// variable, not a function: device code may read it).
template <int NMAX>
constexpr int kFusedReduceUnroll = NMAX <= 4 ? 2 : 1;

}  // namespace cuda_ipc
}  // namespace fastpar
