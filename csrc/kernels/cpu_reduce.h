// The CPU reduce loop: read n sources, reduce in a fixed order (0, 1, ..., n-1),
// write the one result to m destinations.
//
// Why blocks: the number of sources is a runtime value, so an element-outer,
// source-inner loop does not vectorize. Instead a block of kBlock accumulators
// (kBlock * 8 bytes at most, well inside L1) is swept once per source; each
// sweep is a plain streaming loop the compiler turns into SIMD. Memory traffic
// stays at the minimum: every source read once, every destination written once.
//
// Destinations may alias sources element for element (in-place allreduce): a
// block is fully read before any of it is written.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

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

// `streaming`: the caller's outputs do not fit in cache (see stream_store_block).
template <typename T, ReduceOp OP>
void cpu_reduce_range(const T* const* srcs, int nsrc, T* const* dsts, int ndst,
                      int64_t begin, int64_t end, int contributions, bool streaming = false) {
  using A = acc_t<T>;
  A acc[kCpuBlock];
  alignas(64) T out[kCpuBlock];
  for (int64_t b = begin; b < end; b += kCpuBlock) {
    const int64_t len = std::min<int64_t>(kCpuBlock, end - b);
    const T* __restrict__ s0 = srcs[0] + b;
    for (int64_t i = 0; i < len; ++i) acc[i] = load_acc(s0[i]);
    for (int s = 1; s < nsrc; ++s) {
      const T* __restrict__ p = srcs[s] + b;
      for (int64_t i = 0; i < len; ++i) acc[i] = combine<OP>(acc[i], load_acc(p[i]));
    }
    if constexpr (OP == ReduceOp::AVG) {
      for (int64_t i = 0; i < len; ++i) acc[i] = finalize<OP>(acc[i], contributions);
    }
    if (streaming) {
      for (int64_t i = 0; i < len; ++i) out[i] = store_acc<T>(acc[i]);
      for (int d = 0; d < ndst; ++d) {
        if (!stream_store_block(dsts[d] + b, out, len * int64_t(sizeof(T))))
          for (int64_t i = 0; i < len; ++i) dsts[d][b + i] = out[i];
      }
      continue;
    }
    for (int d = 0; d < ndst; ++d) {
      T* __restrict__ q = dsts[d] + b;
      for (int64_t i = 0; i < len; ++i) q[i] = store_acc<T>(acc[i]);
    }
  }
  if (streaming) stream_store_fence();
}

// Partial step of a pipelined schedule (the ring): fold one source into an
// accumulator buffer kept in the accumulator type, so 16-bit inputs still
// accumulate in fp32 across steps. `first` starts the accumulator from `prev`
// converted, otherwise `prev` is the previous rank's accumulator.
template <typename T, ReduceOp OP>
void cpu_accumulate_range(const acc_t<T>* prev_acc, const T* prev_data, const T* mine,
                          acc_t<T>* out_acc, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const acc_t<T> a = prev_acc ? prev_acc[i] : load_acc(prev_data[i]);
    out_acc[i] = combine<OP>(a, load_acc(mine[i]));
  }
}

// Last step of the ring's reduce-scatter: fold, finalize and store as T.
template <typename T, ReduceOp OP>
void cpu_finish_range(const acc_t<T>* prev_acc, const T* prev_data, const T* mine, T* out,
                      int64_t begin, int64_t end, int contributions) {
  for (int64_t i = begin; i < end; ++i) {
    const acc_t<T> a = prev_acc ? prev_acc[i] : load_acc(prev_data[i]);
    out[i] = store_acc<T>(finalize<OP>(combine<OP>(a, load_acc(mine[i])), contributions));
  }
}

}  // namespace fastpar
