// The data loops of the one-kernel collectives (ipc_fused_two_shot.h,
// ipc_fused_collectives.h): a copy and an in-order reduction over one block's
// threads, in 16-byte packs with several packs in flight per thread. A copy
// whose ends are not both 16-byte aligned peels a head to align them when
// they share their misalignment, else moves the widest word they share (8,
// 4 or 2 bytes) the same way; a reduction peels a head when every source
// and destination shares its misalignment, else runs an exact scalar loop.
// Host and device: the host emulation runs them thread by thread.
#pragma once

#include <cuda_runtime_api.h>  // uint2, uint4

#include <cstdint>
#include <type_traits>
#if defined(FASTPAR_COUNT_FUSED_LOOPS)
#include <atomic>
#endif

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

// Which main loop a copy or reduction ran: 16-byte packs, 8-, 4- or 2-byte
// words, or elements one by one. The host emulation counts them
// (FASTPAR_COUNT_FUSED_LOOPS, its fake CUDA runtime defines it); nothing is
// counted on the GPU.
enum class FusedLoop : int { kPack16 = 0, kWord8, kWord4, kWord2, kScalar, kCount };
#if defined(FASTPAR_COUNT_FUSED_LOOPS) && !defined(__CUDA_ARCH__)
inline std::atomic<int64_t> g_fused_loops[int(FusedLoop::kCount)];
inline void count_fused_loop(FusedLoop l) { g_fused_loops[int(l)].fetch_add(1, std::memory_order_relaxed); }
#else
FASTPAR_HD void count_fused_loop(FusedLoop) {}
#endif

// Packs in flight per thread in the copies (fused_copy): 4 words, so a warp
// has 2 KiB of 16-byte loads outstanding instead of 512 bytes.
constexpr int kFusedCopyUnroll = 4;

template <int W> struct FusedWord;
template <> struct FusedWord<16> { using type = uint4; };
template <> struct FusedWord<8> { using type = uint2; };
template <> struct FusedWord<4> { using type = uint32_t; };
template <> struct FusedWord<2> { using type = uint16_t; };

// d[0, words) = s[0, words) in W-byte words, thread t of nt: kFusedCopyUnroll
// words loaded before any is stored, then the rest word by word.
template <int W>
FASTPAR_HD void fused_copy_words(char* d, const char* s, int64_t words, int t, int nt) {
  using Word = typename FusedWord<W>::type;
  constexpr int U = kFusedCopyUnroll;
  const Word* sw = reinterpret_cast<const Word*>(s);
  Word* dw = reinterpret_cast<Word*>(d);
  int64_t v = t;
  for (; v + int64_t(U - 1) * nt < words; v += int64_t(U) * nt) {
    Word x[U];
    FASTPAR_FUSED_UNROLL
    for (int u = 0; u < U; ++u) x[u] = sw[v + int64_t(u) * nt];
    FASTPAR_FUSED_UNROLL
    for (int u = 0; u < U; ++u) dw[v + int64_t(u) * nt] = x[u];
  }
  for (; v < words; v += nt) dw[v] = sw[v];
}

// dst[0, n) = src[0, n) (T elements, moved as bytes), thread t of nt. The
// widest word W (16, 8, 4, 2) by which dst and src are equally misaligned;
// a head of fewer than W bytes aligns both, then W-byte words with
// kFusedCopyUnroll in flight, then a tail of fewer than W bytes. Elements of
// T are aligned, so W >= sizeof(T) whenever sizeof(T) is 2, 4, 8 or 16. The
// buffers never overlap, or are the same (a copy onto itself).
template <typename T>
FASTPAR_HD void fused_copy(T* dst, const T* src, int64_t n, int t, int nt) {
  char* d = reinterpret_cast<char*>(dst);
  const char* s = reinterpret_cast<const char*>(src);
  const int64_t bytes = n * int64_t(sizeof(T));
  if (bytes <= 0) return;
  const uintptr_t apart = reinterpret_cast<uintptr_t>(d) ^ reinterpret_cast<uintptr_t>(s);
  const int w = (apart & 15u) == 0 ? 16 : (apart & 7u) == 0 ? 8 : (apart & 3u) == 0 ? 4 : (apart & 1u) == 0 ? 2 : 1;
  int64_t head = int64_t((uintptr_t(w) - (reinterpret_cast<uintptr_t>(d) & uintptr_t(w - 1))) & uintptr_t(w - 1));
  if (head > bytes) head = bytes;
  const int64_t words = w > 1 ? (bytes - head) / w : 0;
  if (t == 0)
    count_fused_loop(w == 16 ? FusedLoop::kPack16 : w == 8 ? FusedLoop::kWord8 : w == 4 ? FusedLoop::kWord4
                     : w == 2 ? FusedLoop::kWord2 : FusedLoop::kScalar);
  switch (w) {
    case 16: fused_copy_words<16>(d + head, s + head, words, t, nt); break;
    case 8: fused_copy_words<8>(d + head, s + head, words, t, nt); break;
    case 4: fused_copy_words<4>(d + head, s + head, words, t, nt); break;
    case 2: fused_copy_words<2>(d + head, s + head, words, t, nt); break;
    default: break;
  }
  for (int64_t i = t; i < head; i += nt) d[i] = s[i];
  for (int64_t i = head + words * w + t; i < bytes; i += nt) d[i] = s[i];
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
    uint32_t word[4];
  };
  // 1-byte integers combine four to a 32-bit word (reduce_ops.h).
  static constexpr bool kBytewise = kCombinesBytewise<OP, T>;
  // The accumulators carried from group to group: packed when they are T
  // (a byte in a register of its own would take 16 registers a pack).
  struct Wide {
    A e[V];
  };
  using Carry = std::conditional_t<std::is_same_v<A, T>, Pack, Wide>;

  template <int U, int ND>
  static FASTPAR_HD void run(const T* const* src, int n, T* const* dst, int nd, int64_t len, int contributions,
                             int t, int nt) {
    // Every end misaligned alike: a head of fewer than V elements aligns them.
    const uintptr_t mis = reinterpret_cast<uintptr_t>(src[0]) & 15u;
    bool vec = true;
    FASTPAR_FUSED_UNROLL
    for (int d = 0; d < ND; ++d)
      if (d < nd) vec = vec && (reinterpret_cast<uintptr_t>(dst[d]) & 15u) == mis;
    FASTPAR_FUSED_UNROLL
    for (int q = 0; q < kMaxIpcRanks; ++q)
      if (q < n) vec = vec && (reinterpret_cast<uintptr_t>(src[q]) & 15u) == mis;
    int64_t head = vec ? int64_t((16u - mis) & 15u) / int64_t(sizeof(T)) : len;
    if (head > len) head = len;
    int64_t tail = len;
    if (len > 0 && t == 0) count_fused_loop(vec ? FusedLoop::kPack16 : FusedLoop::kScalar);
    if (vec) {
      const int64_t packs = (len - head) / V;
      int64_t v = t;
      if (n <= G) {  // one group: U packs in flight
        for (; v + int64_t(U - 1) * nt < packs; v += int64_t(U) * nt)
          packs_at<U, 1, ND>(src, n, dst, nd, head, v, nt, contributions);
        for (; v < packs; v += nt) packs_at<1, 1, ND>(src, n, dst, nd, head, v, nt, contributions);
      } else {  // the accumulators live across the groups: one pack at a time
        for (; v < packs; v += nt) packs_at<1, kMaxIpcRanks / G, ND>(src, n, dst, nd, head, v, nt, contributions);
      }
      tail = head + packs * V;
    }
    // The head and the tail (everything, where the ends are misaligned
    // differently): one element at a time.
    scalar_range<ND>(src, n, dst, nd, 0, head, contributions, t, nt);
    scalar_range<ND>(src, n, dst, nd, tail, len, contributions, t, nt);
  }

 private:
  // Elements [lo, hi), thread t of nt, one load at a time.
  template <int ND>
  static FASTPAR_HD void scalar_range(const T* const* src, int n, T* const* dst, int nd, int64_t lo, int64_t hi,
                                      int contributions, int t, int nt) {
    for (int64_t i = lo + t; i < hi; i += nt) {
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

  // Packs v, v + nt, .., v + (U - 1) * nt past element `base` of the sources (at most NG groups
  // of them), combined element by element in rank order, into every destination.
  template <int U, int NG, int ND>
  static FASTPAR_HD void packs_at(const T* const* src, int n, T* const* dst, int nd, int64_t base, int64_t v, int nt,
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
            if (g + j < n) x[u][j].w = reinterpret_cast<const uint4*>(src[g + j] + base)[v + int64_t(u) * nt];
        }
        FASTPAR_FUSED_UNROLL
        for (int u = 0; u < U; ++u) {
          if constexpr (kBytewise) {
            FASTPAR_FUSED_UNROLL
            for (int k = 0; k < 4; ++k) {
              uint32_t y = g == 0 ? x[u][0].word[k] : combine_bytes<OP, T>(acc[u].word[k], x[u][0].word[k]);
              FASTPAR_FUSED_UNROLL
              for (int j = 1; j < G; ++j)
                if (g + j < n) y = combine_bytes<OP, T>(y, x[u][j].word[k]);
              acc[u].word[k] = y;
            }
          } else {
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
    }
    FASTPAR_FUSED_UNROLL
    for (int u = 0; u < U; ++u) {
      Pack y;
      if constexpr (std::is_same_v<Carry, Pack> && OP != ReduceOp::AVG) {
        y.w = acc[u].w;  // nothing to finalize
      } else {
        FASTPAR_FUSED_UNROLL
        for (int e = 0; e < V; ++e) y.e[e] = store_acc<T>(finalize<OP>(load_acc(acc[u].e[e]), contributions));
      }
      FASTPAR_FUSED_UNROLL
      for (int d = 0; d < ND; ++d)
        if (d < nd) reinterpret_cast<uint4*>(dst[d] + base)[v + int64_t(u) * nt] = y.w;
    }
  }
};

// Packs per thread per iteration of the fused one-shot's reduction (U of
// FusedReduce::run): 2, but 1 for 1-byte types, whose 16 elements a pack take
// a register each once unpacked (PRODUCT, AVG's division), and which spill
// with 2. The fused two-shot and collectives kernels reduce one pack at a
// time: their other paths hold more registers, and with 2 they spill
// (tests/tooling/test_cuda_resources.py checks every instance).
template <typename T>
constexpr int kFusedReduceUnroll = sizeof(T) == 1 ? 1 : 2;

}  // namespace cuda_ipc
}  // namespace fastpar
