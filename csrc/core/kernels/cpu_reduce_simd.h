// Vector versions of the CPU reduce loops for float32, float16 and bfloat16:
// 16-bit inputs widen to fp32, accumulate in fp32 in the source order
// 0, 1, ..., n-1, and round once, exactly as the scalar loops in cpu_reduce.h
// do, 8 (AVX2) or 16 (AVX-512) elements at a time.
//
// Why the bits match the scalar path:
//  * bf16 -> fp32 is a 16-bit shift (or, for the odd element of a pair that
//    shares a 32-bit lane, a mask: load_pairs), fp16 -> fp32 (VCVTPH2PS)
//    is exact;
//  * the fp32 operations (add, mul, div for AVG) are the same IEEE operations
//    in the same order; MIN/MAX select the same operand as combine<OP>
//    (NaN-propagating, first operand on ties, so -0/+0 too);
//  * fp32 -> bf16 rounds with the same integer round-to-nearest-even as
//    to_bf16; with AVX512-BF16, VCVTNE2PS2BF16 rounds to nearest even too and
//    quiets NaNs as to_bf16 does, but it flushes subnormal inputs to zero, so
//    a vector holding one (VFPCLASSPS finds it) takes the integer rounding;
//    fp32 -> fp16 with
//    VCVTPS2PH in round-to-nearest-even, which handles subnormals and overflow
//    as to_f16 does; NaN results are rewritten to to_f16's canonical NaN.
// The one thing not pinned down is which NaN an addition or multiplication
// returns when both operands are NaN (the compiler may swap a scalar a + b):
// a NaN result is NaN in every path, its payload and sign may differ between
// the scalar and the vector path. Every rank of one group runs one path on the
// elements it reduces and the others copy them, so all ranks still agree.
// tests/cpp/test_cpu_reduce_simd.cpp checks all of this against the scalar loop.
//
// The functions are compiled for their ISA with a target pragma (the rest of
// the extension stays plain x86-64) and only called after cpu_isa() said the
// CPU has it.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu_isa.h"
#include "reduce_ops.h"

#if FASTPAR_X86_SIMD
#include <immintrin.h>

#if defined(__clang__)
#define FASTPAR_TARGET_PUSH_AVX2 _Pragma("clang attribute push(__attribute__((target(\"avx2,f16c\"))), apply_to = function)")
#define FASTPAR_TARGET_PUSH_AVX512 \
  _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx512bw,avx512vl,avx2,f16c\"))), apply_to = function)")
#define FASTPAR_TARGET_PUSH_AVX512BF16 \
  _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,f16c\"))), apply_to = function)")
#define FASTPAR_TARGET_POP _Pragma("clang attribute pop")
#else
// GCC 12's own intrinsics trip -Wmaybe-uninitialized (their _mm512_undefined_*
// self-initialization), hence the diagnostic push around the regions.
#define FASTPAR_TARGET_PUSH_AVX2                                                      \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,f16c\")") _Pragma("GCC diagnostic push") \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define FASTPAR_TARGET_PUSH_AVX512                                                                     \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx512f,avx512bw,avx512vl,avx2,f16c\")")            \
      _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define FASTPAR_TARGET_PUSH_AVX512BF16                                                                    \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,f16c\")") \
      _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define FASTPAR_TARGET_POP _Pragma("GCC diagnostic pop") _Pragma("GCC pop_options")
#endif

// ---------------------------------------------------------------- AVX2 + F16C
FASTPAR_TARGET_PUSH_AVX2
namespace fastpar {
namespace simd_avx2 {

constexpr int kLanes = 8;
using vf = __m256;

inline vf load(const float* p) { return _mm256_loadu_ps(p); }
inline vf load(const bf16* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline vf load(const f16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

inline void store(float* p, vf v) { _mm256_storeu_ps(p, v); }
// Each lane's bf16 in its high 16 bits: to_bf16's round to nearest even, NaN
// quieted (bit 22, the bf16's bit 6).
inline __m256i bf16_high_bits(vf v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
  const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
  return _mm256_blendv_epi8(rounded, quiet, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}
inline void store(bf16* p, vf v) {
  const __m256i r = _mm256_srli_epi32(bf16_high_bits(v), 16);
  // 32 -> 16 bits: packus works per 128-bit lane, the permute joins the halves.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
// 2 * kLanes bf16 elements as two vectors, without moving data across lanes:
// a 32-bit lane holds elements 2j (low half) and 2j+1 (high half); shifted
// left, the low one is an fp32, masked, the high one is.
inline void load_pairs(const bf16* p, vf& even, vf& odd) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(int(0xffff0000u))));
}
inline void store_pairs(bf16* p, vf even, vf odd) {
  const __m256i lo = _mm256_srli_epi32(bf16_high_bits(even), 16);
  const __m256i hi = _mm256_and_si256(bf16_high_bits(odd), _mm256_set1_epi32(int(0xffff0000u)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_or_si256(lo, hi));
}
inline void store(f16* p, vf v) {
  const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
  const __m128i canon = _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16(short(0x8000))), _mm_set1_epi16(0x7e00));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_blendv_epi8(h, canon, nan16));
}

inline vf set1(float x) { return _mm256_set1_ps(x); }
inline vf add(vf a, vf b) { return _mm256_add_ps(a, b); }
inline vf mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf div(vf a, vf b) { return _mm256_div_ps(a, b); }
// combine<MIN>: a if a is NaN, else b if b < a or b is NaN, else a.
inline vf vmin(vf a, vf b) {
  const vf take_b = _mm256_or_ps(_mm256_cmp_ps(b, a, _CMP_LT_OQ), _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
  return _mm256_blendv_ps(a, b, _mm256_andnot_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q), take_b));
}
inline vf vmax(vf a, vf b) {
  const vf take_b = _mm256_or_ps(_mm256_cmp_ps(b, a, _CMP_GT_OQ), _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
  return _mm256_blendv_ps(a, b, _mm256_andnot_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q), take_b));
}

#include "cpu_reduce_simd_body.inc"

}  // namespace simd_avx2
}  // namespace fastpar
FASTPAR_TARGET_POP

// ---------------------------------------------------------- AVX-512 F/BW/VL
FASTPAR_TARGET_PUSH_AVX512
namespace fastpar {
namespace simd_avx512 {

constexpr int kLanes = 16;
using vf = __m512;

inline vf load(const float* p) { return _mm512_loadu_ps(p); }
inline vf load(const bf16* p) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
inline vf load(const f16* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

inline void store(float* p, vf v) { _mm512_storeu_ps(p, v); }
// As simd_avx2::bf16_high_bits.
inline __m512i bf16_high_bits(vf v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
  return _mm512_mask_or_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), u, _mm512_set1_epi32(0x400000));
}
inline void store(bf16* p, vf v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_high_bits(v), 16)));
}
// As simd_avx2::load_pairs / store_pairs.
inline void load_pairs(const bf16* p, vf& even, vf& odd) {
  const __m512i w = _mm512_loadu_si512(p);
  even = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  odd = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(int(0xffff0000u))));
}
inline void store_pairs(bf16* p, vf even, vf odd) {
  // lo | (hi & 0xffff0000) in one ternary-logic op (0xf8 = A | (B & C)).
  const __m512i lo = _mm512_srli_epi32(bf16_high_bits(even), 16);
  _mm512_storeu_si512(p, _mm512_ternarylogic_epi32(lo, bf16_high_bits(odd), _mm512_set1_epi32(int(0xffff0000u)), 0xf8));
}
inline void store(f16* p, vf v) {
  const __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256i canon = _mm256_or_si256(_mm256_and_si256(h, _mm256_set1_epi16(short(0x8000))), _mm256_set1_epi16(0x7e00));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm256_mask_blend_epi16(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), h, canon));
}

inline vf set1(float x) { return _mm512_set1_ps(x); }
inline vf add(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf div(vf a, vf b) { return _mm512_div_ps(a, b); }
inline vf vmin(vf a, vf b) {
  const __mmask16 take_b = _mm512_cmp_ps_mask(b, a, _CMP_LT_OQ) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
  return _mm512_mask_blend_ps(__mmask16(take_b & ~_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q)), a, b);
}
inline vf vmax(vf a, vf b) {
  const __mmask16 take_b = _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
  return _mm512_mask_blend_ps(__mmask16(take_b & ~_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q)), a, b);
}

#include "cpu_reduce_simd_body.inc"

}  // namespace simd_avx512
}  // namespace fastpar
FASTPAR_TARGET_POP

// ------------------------------------------------ AVX-512 with AVX512-BF16
// The AVX-512 loops with bfloat16 stores by VCVTNE2PS2BF16: one conversion
// and one permute per 32 elements instead of two integer roundings
// (benchmarks/bench_cpu_isa.py compares it with plain AVX-512).
FASTPAR_TARGET_PUSH_AVX512BF16
namespace fastpar {
namespace simd_avx512bf16 {

using simd_avx512::add;
using simd_avx512::div;
using simd_avx512::kLanes;
using simd_avx512::load;
using simd_avx512::load_pairs;
using simd_avx512::mul;
using simd_avx512::set1;
using simd_avx512::vf;
using simd_avx512::vmax;
using simd_avx512::vmin;
inline void store(float* p, vf v) { simd_avx512::store(p, v); }
inline void store(f16* p, vf v) { simd_avx512::store(p, v); }

// VFPCLASSPS category 0x20: subnormal, which VCVTNE(2)PS2BF16 would flush.
inline bool any_subnormal(vf v) { return _mm512_fpclass_ps_mask(v, 0x20) != 0; }

inline void store(bf16* p, vf v) {
  if (__builtin_expect(any_subnormal(v), 0)) return simd_avx512::store(p, v);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(v));  // a vector cast: same bits
}
inline void store_pairs(bf16* p, vf even, vf odd) {
  if (__builtin_expect(any_subnormal(even) || any_subnormal(odd), 0)) return simd_avx512::store_pairs(p, even, odd);
  // [even 0..15, odd 0..15] -> even 0, odd 0, even 1, odd 1, ...
  const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh(odd, even);
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                              6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  _mm512_storeu_si512(p, _mm512_permutexvar_epi16(interleave, halves));
}

#include "cpu_reduce_simd_body.inc"

}  // namespace simd_avx512bf16
}  // namespace fastpar
FASTPAR_TARGET_POP

#endif  // FASTPAR_X86_SIMD

namespace fastpar {

// The storage types with a vector path (every other dtype takes the scalar
// loops, which the compiler vectorizes itself where it can).
template <typename T> constexpr bool has_simd_reduce() { return false; }
template <> constexpr bool has_simd_reduce<float>() { return true; }
template <> constexpr bool has_simd_reduce<f16>() { return true; }
template <> constexpr bool has_simd_reduce<bf16>() { return true; }

}  // namespace fastpar
