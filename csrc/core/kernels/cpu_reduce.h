// The CPU reduce loop: read n sources, reduce in a fixed order (0, 1, ..., n-1),
// write the one result to m destinations.
//
// Why blocks: on the vector paths, one or two destinations take the results
// directly, as each vector is formed; with more, in the scalar loop, or for
// outputs larger than the caches, a block of kCpuBlock results is computed
// into a small buffer in L1 and then copied to each destination (with
// non-temporal stores when streaming, see stream_store_block). Either way
// memory traffic stays at the minimum (every source read once, every
// destination written once), and destinations may alias sources element for
// element (in-place allreduce): each vector reads its elements of every source
// before it writes them, and a staged block is fully read before any of it is
// written.
//
// float32, float16 and bfloat16 blocks are computed by the vector loops of
// cpu_reduce_simd.h when the CPU has AVX2 or AVX-512 (cpu_isa()), with the
// same bits as the scalar loops here; the `_isa` variants take the choice as
// an argument (tests compare every ISA with kScalar).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu_reduce_simd.h"
#include "reduce_ops.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace fastpar {

constexpr int64_t kCpuBlock = 512;

// Copies one finished block to a destination with non-temporal stores when
// both are 16-byte aligned. Why: for outputs larger than the caches an
// ordinary store first reads the line it overwrites (read-for-ownership), so a
// k-way allreduce would move 3k streams instead of 2k; memcpy avoids that the
// same way. Returns false when it did not apply (caller stores normally).
inline bool stream_store_block(void* dst, const void* src, int64_t bytes) {
#if defined(__SSE2__)
  if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | uintptr_t(bytes)) & 15) return false;
  auto* d = static_cast<__m128i*>(dst);
  const auto* s = static_cast<const __m128i*>(src);
  for (int64_t i = 0; i < bytes / 16; ++i) _mm_stream_si128(d + i, _mm_load_si128(s + i));
  return true;
#else
  (void)dst, (void)src, (void)bytes;
  return false;
#endif
}

inline void stream_store_fence() {
#if defined(__SSE2__)
  _mm_sfence();  // non-temporal stores are weakly ordered: publish before returning
#endif
}

// memcpy with non-temporal stores for any alignment (ordinary stores for the
// bytes before dst's first 16-byte boundary and after its last), fenced: the
// far-placement allreduce publishes its slots this way so that a peer reads
// them from memory instead of from this core's cache (shm_placement.h).
inline void stream_copy(void* dst, const void* src, int64_t bytes) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
#if defined(__SSE2__)
  const int64_t head = std::min<int64_t>(bytes, int64_t((16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15));
  std::memcpy(d, s, size_t(head));
  d += head, s += head, bytes -= head;
  auto* dv = reinterpret_cast<__m128i*>(d);
  const auto* sv = reinterpret_cast<const __m128i*>(s);
  const int64_t vecs = bytes / 16;
  for (int64_t i = 0; i < vecs; ++i) _mm_stream_si128(dv + i, _mm_loadu_si128(sv + i));
  d += vecs * 16, s += vecs * 16, bytes -= vecs * 16;
#endif
  std::memcpy(d, s, size_t(bytes));
  stream_store_fence();
}

// Writes one finished block (`out`, already in T) to every destination.
template <typename T>
inline void write_block(T* const* dsts, int ndst, int64_t b, const T* out, int64_t len, bool streaming) {
  const int64_t bytes = len * int64_t(sizeof(T));
  if (bytes <= 0) return;  // also tells GCC the size is positive (-Wstringop-overflow)
  for (int d = 0; d < ndst; ++d) {
    if (!streaming || !stream_store_block(dsts[d] + b, out, bytes)) std::memcpy(dsts[d] + b, out, size_t(bytes));
  }
}

// Whether the loops write the destinations directly (above): the vector
// paths, into one or two, where that beat staging and copying
// (docs/measurements.md). The scalar loop (other dtypes) stays staged: the
// compiler vectorizes it into the staging block, which cannot alias the
// sources, but not always into a destination that may.
template <typename T>
inline bool direct(CpuIsa isa, int ndst, bool streaming) {
  return !streaming && (ndst == 1 || ndst == 2) && has_simd_reduce<T>() && isa != CpuIsa::kScalar;
}

// One block, out[i] = finalize(s[0][b+i] (+) ... (+) s[n-1][b+i]), on `isa`
// (K sources at compile time, or K == 0 and nsrc); the vector paths also write
// also[i] the same unless `also` is null.
template <typename T, ReduceOp OP, int K>
inline void reduce_block_isa(CpuIsa isa, const T* const* s, int nsrc, int64_t b, T* out, T* also, int64_t len,
                             int contributions) {
#if FASTPAR_X86_SIMD
  if constexpr (has_simd_reduce<T>()) {
    // AVX512-BF16 changes bfloat16's stores only: other dtypes take AVX-512.
    if constexpr (std::is_same_v<T, bf16>)
      if (isa == CpuIsa::kAvx512Bf16)
        return simd_avx512bf16::reduce_block<T, OP, K>(s, nsrc, b, out, also, len, contributions);
    if (isa >= CpuIsa::kAvx512) return simd_avx512::reduce_block<T, OP, K>(s, nsrc, b, out, also, len, contributions);
    if (isa == CpuIsa::kAvx2) return simd_avx2::reduce_block<T, OP, K>(s, nsrc, b, out, also, len, contributions);
  }
#endif
  (void)isa, (void)also;  // never two destinations here: direct() stages the scalar loop's
  const int n = K > 0 ? K : nsrc;
  for (int64_t i = 0; i < len; ++i) {
    acc_t<T> v = load_acc(s[0][b + i]);
#pragma GCC unroll 8
    for (int k = 1; k < n; ++k) v = combine<OP>(v, load_acc(s[k][b + i]));
    out[i] = store_acc<T>(finalize<OP>(v, contributions));
  }
}

// One pass over [begin, end) on `isa`: straight into the destinations where
// direct() says so, else block by block through a staging buffer (K sources
// at compile time, or K == 0 and nsrc).
template <typename T, ReduceOp OP, int K>
void reduce_range_blocks(CpuIsa isa, const T* const* s, int nsrc, T* const* dsts, int ndst, int64_t begin,
                         int64_t end, int contributions, bool streaming) {
  if (direct<T>(isa, ndst, streaming))
    return reduce_block_isa<T, OP, K>(isa, s, nsrc, begin, dsts[0] + begin, ndst == 2 ? dsts[1] + begin : nullptr,
                                      end - begin, contributions);
  alignas(64) T out[kCpuBlock];
  for (int64_t b = begin; b < end; b += kCpuBlock) {
    const int64_t len = std::min<int64_t>(kCpuBlock, end - b);
    reduce_block_isa<T, OP, K>(isa, s, nsrc, b, out, nullptr, len, contributions);
    write_block(dsts, ndst, b, out, len, streaming);
  }
  if (streaming) stream_store_fence();
}

// K sources known at compile time (the common 2..8): one element-wise pass with
// the sources unrolled, the value kept in a register and written to the
// destinations (directly, or by way of a staged block: see direct()). Faster
// than the generic loop below, which re-reads and re-writes its accumulator
// block once per source (docs/measurements.md).
template <typename T, ReduceOp OP, int K>
void cpu_reduce_range_k(CpuIsa isa, const T* const* srcs, T* const* dsts, int ndst, int64_t begin, int64_t end,
                        int contributions, bool streaming) {
  const T* s[K];
  for (int k = 0; k < K; ++k) s[k] = srcs[k];
  reduce_range_blocks<T, OP, K>(isa, s, K, dsts, ndst, begin, end, contributions, streaming);
}

// `streaming`: the caller's outputs do not fit in cache (see stream_store_block).
// Every path reduces sources in the order 0, 1, ..., nsrc-1.
template <typename T, ReduceOp OP>
void cpu_reduce_range_isa(CpuIsa isa, const T* const* srcs, int nsrc, T* const* dsts, int ndst,
                          int64_t begin, int64_t end, int contributions, bool streaming = false) {
  switch (nsrc) {
    case 1: return cpu_reduce_range_k<T, OP, 1>(isa, srcs, dsts, ndst, begin, end, contributions, streaming);
    case 2: return cpu_reduce_range_k<T, OP, 2>(isa, srcs, dsts, ndst, begin, end, contributions, streaming);
    case 3: return cpu_reduce_range_k<T, OP, 3>(isa, srcs, dsts, ndst, begin, end, contributions, streaming);
    case 4: return cpu_reduce_range_k<T, OP, 4>(isa, srcs, dsts, ndst, begin, end, contributions, streaming);
    case 5: return cpu_reduce_range_k<T, OP, 5>(isa, srcs, dsts, ndst, begin, end, contributions, streaming);
    case 6: return cpu_reduce_range_k<T, OP, 6>(isa, srcs, dsts, ndst, begin, end, contributions, streaming);
    case 7: return cpu_reduce_range_k<T, OP, 7>(isa, srcs, dsts, ndst, begin, end, contributions, streaming);
    case 8: return cpu_reduce_range_k<T, OP, 8>(isa, srcs, dsts, ndst, begin, end, contributions, streaming);
    default: break;
  }
  if (has_simd_reduce<T>() && isa != CpuIsa::kScalar) {
    // The vector loop keeps each vector of partial results in a register
    // across all sources, like the unrolled case.
    return reduce_range_blocks<T, OP, 0>(isa, srcs, nsrc, dsts, ndst, begin, end, contributions, streaming);
  }
  // Any other count: a block of accumulators swept once per source, each sweep
  // a plain streaming loop the compiler turns into SIMD.
  alignas(64) T out[kCpuBlock];
  using A = acc_t<T>;
  A acc[kCpuBlock];
  for (int64_t b = begin; b < end; b += kCpuBlock) {
    const int64_t len = std::min<int64_t>(kCpuBlock, end - b);
    const T* __restrict__ s0 = srcs[0] + b;
    for (int64_t i = 0; i < len; ++i) acc[i] = load_acc(s0[i]);
    for (int s = 1; s < nsrc; ++s) {
      const T* __restrict__ p = srcs[s] + b;
      for (int64_t i = 0; i < len; ++i) acc[i] = combine<OP>(acc[i], load_acc(p[i]));
    }
    for (int64_t i = 0; i < len; ++i) out[i] = store_acc<T>(finalize<OP>(acc[i], contributions));
    write_block(dsts, ndst, b, out, len, streaming);
  }
  if (streaming) stream_store_fence();
}

template <typename T, ReduceOp OP>
void cpu_reduce_range(const T* const* srcs, int nsrc, T* const* dsts, int ndst, int64_t begin, int64_t end,
                      int contributions, bool streaming = false) {
  cpu_reduce_range_isa<T, OP>(has_simd_reduce<T>() ? cpu_isa() : CpuIsa::kScalar, srcs, nsrc, dsts, ndst, begin,
                              end, contributions, streaming);
}

// Partial step of a pipelined schedule (the ring): fold one source into an
// accumulator buffer kept in the accumulator type, so 16-bit inputs still
// accumulate in fp32 across steps. `first` starts the accumulator from `prev`
// converted, otherwise `prev` is the previous rank's accumulator.
template <typename T, ReduceOp OP>
void cpu_accumulate_range_isa(CpuIsa isa, const acc_t<T>* prev_acc, const T* prev_data, const T* mine,
                              acc_t<T>* out_acc, int64_t begin, int64_t end) {
#if FASTPAR_X86_SIMD
  if constexpr (has_simd_reduce<T>()) {
    if (isa >= CpuIsa::kAvx512)  // (it stores fp32 accumulators only: no bf16 stores)
      return simd_avx512::fold_range<T, OP, false>(prev_acc, prev_data, mine, out_acc, nullptr, begin, end, 1);
    if (isa == CpuIsa::kAvx2)
      return simd_avx2::fold_range<T, OP, false>(prev_acc, prev_data, mine, out_acc, nullptr, begin, end, 1);
  }
#endif
  (void)isa;
  for (int64_t i = begin; i < end; ++i) {
    const acc_t<T> a = prev_acc ? prev_acc[i] : load_acc(prev_data[i]);
    out_acc[i] = combine<OP>(a, load_acc(mine[i]));
  }
}

// Last step of the ring's reduce-scatter: fold, finalize and store as T.
template <typename T, ReduceOp OP>
void cpu_finish_range_isa(CpuIsa isa, const acc_t<T>* prev_acc, const T* prev_data, const T* mine, T* out,
                          int64_t begin, int64_t end, int contributions) {
#if FASTPAR_X86_SIMD
  if constexpr (has_simd_reduce<T>()) {
    if constexpr (std::is_same_v<T, bf16>)
      if (isa == CpuIsa::kAvx512Bf16)
        return simd_avx512bf16::fold_range<T, OP, true>(prev_acc, prev_data, mine, nullptr, out, begin, end,
                                                        contributions);
    if (isa >= CpuIsa::kAvx512)
      return simd_avx512::fold_range<T, OP, true>(prev_acc, prev_data, mine, nullptr, out, begin, end, contributions);
    if (isa == CpuIsa::kAvx2)
      return simd_avx2::fold_range<T, OP, true>(prev_acc, prev_data, mine, nullptr, out, begin, end, contributions);
  }
#endif
  (void)isa;
  for (int64_t i = begin; i < end; ++i) {
    const acc_t<T> a = prev_acc ? prev_acc[i] : load_acc(prev_data[i]);
    out[i] = store_acc<T>(finalize<OP>(combine<OP>(a, load_acc(mine[i])), contributions));
  }
}

template <typename T, ReduceOp OP>
void cpu_accumulate_range(const acc_t<T>* prev_acc, const T* prev_data, const T* mine, acc_t<T>* out_acc,
                          int64_t begin, int64_t end) {
  cpu_accumulate_range_isa<T, OP>(has_simd_reduce<T>() ? cpu_isa() : CpuIsa::kScalar, prev_acc, prev_data, mine,
                                  out_acc, begin, end);
}

template <typename T, ReduceOp OP>
void cpu_finish_range(const acc_t<T>* prev_acc, const T* prev_data, const T* mine, T* out, int64_t begin,
                      int64_t end, int contributions) {
  cpu_finish_range_isa<T, OP>(has_simd_reduce<T>() ? cpu_isa() : CpuIsa::kScalar, prev_acc, prev_data, mine, out,
                              begin, end, contributions);
}

}  // namespace fastpar
