// 16-bit float storage types and their conversions to and from float.
//
// Why our own: the element math must be the same code on the host (the CPU
// path our tests run) and on the device (the CUDA kernels). torch's c10::Half
// drags in torch headers, and cuda_fp16.h is not available to a plain C++
// build, so we keep a tiny torch-free, CUDA-free pair of types whose layout is
// bit-compatible with at::Half / at::BFloat16 (one uint16_t).
//
// Both conversions round to nearest even, exactly as __float2half_rn and
// __float2bfloat16_rn do, so a reduction gives the same bits on either side.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FASTPAR_HD __host__ __device__ __forceinline__
#else
#define FASTPAR_HD inline
#endif

namespace fastpar {

struct alignas(2) f16 { uint16_t bits; };
struct alignas(2) bf16 { uint16_t bits; };

FASTPAR_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

FASTPAR_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

FASTPAR_HD float to_float(bf16 h) { return bits_float(uint32_t(h.bits) << 16); }

FASTPAR_HD bf16 to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return bf16{uint16_t(u >> 16)};
}

FASTPAR_HD float to_float(f16 h) {
  const uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_float(sign);  // signed zero
  // Subnormal half: value is mant * 2^-24, exact in float.
  const float v = float(mant) * 5.9604644775390625e-08f;
  return sign ? -v : v;
}

FASTPAR_HD f16 to_f16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return f16{uint16_t(sign | 0x7e00u)};  // NaN
  if (a >= 0x477ff000u) return f16{uint16_t(sign | 0x7c00u)};  // rounds to inf
  if (a >= 0x38800000u) {                                       // normal half
    const uint32_t r = a + 0x0fffu + ((a >> 13) & 1u) - (112u << 23);
    return f16{uint16_t(sign | (r >> 13))};
  }
  // Subnormal or zero half: scale so the result's units land in the low bits,
  // then let the float adder round to nearest even for us (0.5 == 2^-1 shift).
  const float scaled = bits_float(a) + 0.5f;  // 0.5 = 2^-1: ulp of [0.5,1) is 2^-24
  return f16{uint16_t(sign | (float_bits(scaled) - 0x3f000000u))};
}

}  // namespace fastpar
