// The data loops of the one-kernel collectives (ipc_fused_two_shot.h,
// ipc_fused_collectives.h): a copy and an in-order reduction over one block's
// threads, in 16-byte packs with several packs in flight per thread, and an
// exact scalar loop for what is not whole packs or not 16-byte aligned.
// Host and device: the host emulation runs them thread by thread.
#pragma once

#include <cstdint>
#include <type_traits>

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

// Sources are loaded kFusedLoadGroup ranks at a time: a group's packs are all
// issued before any is combined, and past one group the accumulators carry
// from group to group in rank order. One kernel so serves every rank count up
// to kMaxIpcRanks with the registers of kFusedLoadGroup sources (eight
// sources' packs in flight at once would spill) and the bits of one fold.
constexpr int kFusedLoadGroup = 4;

// dst[d][0, len) = op over src[0 .. n) in rank order, for each of the nd <= ND
// destinations, in the accumulator type (reduce_ops.h, as the reduce kernel:
// the same bits), AVG dividing by `contributions`. U packs per thread per
// iteration up to kFusedLoadGroup ranks (U * n loads in flight), one pack
// past that (kFusedLoadGroup loads in flight).
template <typename T, ReduceOp OP>
struct FusedReduce {
  using A = acc_t<T>;
  static constexpr int V = 16 / int(sizeof(T));
  static constexpr int G = kFusedLoadGroup;
  union Pack {
    uint4 w;
    T e[V];
  };
  // The accumulators carried from group to group: packed when they are T
  // (a byte in a register of its own would take 16 registers a pack).
  struct Wide {
    A e[V];
  };
  using Carry = std::conditional_t<std::is_same_v<A, T>, Pack, Wide>;

  template <int U, int ND>
  static FASTPAR_HD void run(const T* const* src, int n, T* const* dst, int nd, int64_t len, int contributions,
                             int t, int nt) {
    bool vec = true;
    FASTPAR_FUSED_UNROLL
    for (int d = 0; d < ND; ++d)
      if (d < nd) vec = vec && fused_aligned(dst[d]);
    FASTPAR_FUSED_UNROLL
    for (int q = 0; q < kMaxIpcRanks; ++q)
      if (q < n) vec = vec && fused_aligned(src[q]);
    int64_t tail = 0;
    if (vec) {
      const int64_t packs = len / V;
      int64_t v = t;
      if (n <= G) {  // one group: U packs in flight
        for (; v + int64_t(U - 1) * nt < packs; v += int64_t(U) * nt)
          packs_at<U, 1, ND>(src, n, dst, nd, v, nt, contributions);
        for (; v < packs; v += nt) packs_at<1, 1, ND>(src, n, dst, nd, v, nt, contributions);
      } else {  // the accumulators live across the groups: one pack at a time
        for (; v < packs; v += nt) packs_at<1, kMaxIpcRanks / G, ND>(src, n, dst, nd, v, nt, contributions);
      }
      tail = packs * V;
    }
    for (int64_t i = tail + t; i < len; i += nt) {  // less than a pack per source: one load at a time
      A acc = load_acc(src[0][i]);
      FASTPAR_FUSED_UNROLL
      for (int q = 1; q < kMaxIpcRanks; ++q)
        if (q < n) acc = combine<OP>(acc, load_acc(src[q][i]));
      const T y = store_acc<T>(finalize<OP>(acc, contributions));
      FASTPAR_FUSED_UNROLL
      for (int d = 0; d < ND; ++d)
        if (d < nd) dst[d][i] = y;
    }
  }

 private:
  // Packs v, v + nt, .., v + (U - 1) * nt of the sources (at most NG groups
  // of them), combined element by element in rank order, into every destination.
  template <int U, int NG, int ND>
  static FASTPAR_HD void packs_at(const T* const* src, int n, T* const* dst, int nd, int64_t v, int nt,
                                  int contributions) {
    Carry acc[U];
    FASTPAR_FUSED_UNROLL
    for (int g = 0; g < NG * G; g += G) {
      if (g < n) {
        Pack x[U][G];
        FASTPAR_FUSED_UNROLL
        for (int u = 0; u < U; ++u) {
          FASTPAR_FUSED_UNROLL
          for (int j = 0; j < G; ++j)
            if (g + j < n) x[u][j].w = reinterpret_cast<const uint4*>(src[g + j])[v + int64_t(u) * nt];
        }
        FASTPAR_FUSED_UNROLL
        for (int u = 0; u < U; ++u) {
          FASTPAR_FUSED_UNROLL
          for (int e = 0; e < V; ++e) {
            A y = g == 0 ? load_acc(x[u][0].e[e]) : combine<OP>(load_acc(acc[u].e[e]), load_acc(x[u][0].e[e]));
            FASTPAR_FUSED_UNROLL
            for (int j = 1; j < G; ++j)
              if (g + j < n) y = combine<OP>(y, load_acc(x[u][j].e[e]));
            acc[u].e[e] = y;
          }
        }
      }
    }
    FASTPAR_FUSED_UNROLL
    for (int u = 0; u < U; ++u) {
      Pack y;
      FASTPAR_FUSED_UNROLL
      for (int e = 0; e < V; ++e) y.e[e] = store_acc<T>(finalize<OP>(load_acc(acc[u].e[e]), contributions));
      FASTPAR_FUSED_UNROLL
      for (int d = 0; d < ND; ++d)
        if (d < nd) reinterpret_cast<uint4*>(dst[d])[v + int64_t(u) * nt] = y.w;
    }
  }
};

// Packs per thread per iteration of the fused one-shot's reduction (U of
// FusedReduce::run). The fused two-shot and collectives kernels reduce one
// pack at a time: their other paths hold more registers, and with 2 they
// spill (tests/tooling/test_cuda_resources.py checks every instance).
constexpr int kFusedReduceUnroll = 2;

}  // namespace cuda_ipc
}  // namespace fastpar
