// Element math shared by the CPU loops and the CUDA kernels.
//
// One header, no torch and no CUDA runtime includes, so that:
//  * the C++ unit tests (CMake, ctest) check the exact arithmetic the GPU runs;
//  * every transport reduces in the same order with the same accumulator type,
//    which is what makes every rank's output bitwise identical.
//
// Accumulation: 16-bit floats accumulate in fp32 and round once at the end;
// every other type accumulates in itself (integers wrap, as in NCCL).
// docs/semantics.md states the results for users.
#pragma once

#include <cstdint>
#include <type_traits>

#include "half_types.h"

namespace fastpar {

// Values match torch.distributed.ReduceOp's RedOpType so Python can pass
// ReduceOp.SUM etc. straight through. The bitwise ops reduce integer tensors
// on the CPU only (FASTPAR_DISPATCH_CPU_OP); the CUDA kernels have the
// arithmetic ones, and the CUDA engine hands the others to NCCL.
enum class ReduceOp : int { SUM = 0, AVG = 1, PRODUCT = 2, MIN = 3, MAX = 4, BAND = 5, BOR = 6, BXOR = 7 };

constexpr bool is_bitwise(ReduceOp op) { return op == ReduceOp::BAND || op == ReduceOp::BOR || op == ReduceOp::BXOR; }

enum class DType : int { F32 = 0, F64, F16, BF16, I8, U8, I32, I64 };

template <typename T> struct Acc { using type = T; };
template <> struct Acc<f16> { using type = float; };
template <> struct Acc<bf16> { using type = float; };
template <typename T> using acc_t = typename Acc<T>::type;

template <typename T> FASTPAR_HD acc_t<T> load_acc(T v) { return v; }
FASTPAR_HD float load_acc(f16 v) { return to_float(v); }
FASTPAR_HD float load_acc(bf16 v) { return to_float(v); }

template <typename T> FASTPAR_HD T store_acc(acc_t<T> v) { return T(v); }
template <> FASTPAR_HD f16 store_acc<f16>(float v) { return to_f16(v); }
template <> FASTPAR_HD bf16 store_acc<bf16>(float v) { return to_bf16(v); }

template <typename T> constexpr bool is_floating() { return false; }
template <> constexpr bool is_floating<float>() { return true; }
template <> constexpr bool is_floating<double>() { return true; }
template <> constexpr bool is_floating<f16>() { return true; }
template <> constexpr bool is_floating<bf16>() { return true; }

// a (+) b for one reduce op. MIN/MAX propagate NaN as torch.minimum/maximum do.
// Integer SUM/PRODUCT go through the unsigned type: two's-complement wrap, as
// NCCL's (which runs signed sums on its unsigned kernels), and no signed
// overflow for the compiler to assume away.
template <ReduceOp OP, typename A> FASTPAR_HD A combine(A a, A b) {
  if constexpr (OP == ReduceOp::SUM || OP == ReduceOp::AVG || OP == ReduceOp::PRODUCT) {
    if constexpr (std::is_integral_v<A>) {
      using U = std::make_unsigned_t<A>;
      return A(OP == ReduceOp::PRODUCT ? U(U(a) * U(b)) : U(U(a) + U(b)));
    } else {
      return OP == ReduceOp::PRODUCT ? a * b : a + b;
    }
  } else if constexpr (OP == ReduceOp::MIN) {
    return (a != a) ? a : ((b < a || b != b) ? b : a);
  } else if constexpr (OP == ReduceOp::MAX) {
    return (a != a) ? a : ((b > a || b != b) ? b : a);
  } else {
    static_assert(is_bitwise(OP) && std::is_integral_v<A>, "bitwise ops reduce integers only");
    return A(OP == ReduceOp::BAND ? (a & b) : OP == ReduceOp::BOR ? (a | b) : (a ^ b));
  }
}

// Four 1-byte elements in one 32-bit word combined at once, each byte exactly
// combine<OP> of its own (integers, no NaN): a 16-byte pack of int8 or uint8
// is reduced as 4 words instead of 16 unpacked registers, which is what spills
// a kernel holding its other paths' registers too. PRODUCT has no such form.
template <ReduceOp OP, typename T>
constexpr bool kCombinesBytewise = sizeof(T) == 1 && std::is_integral_v<T> && OP != ReduceOp::PRODUCT;

template <ReduceOp OP, typename T>
FASTPAR_HD uint32_t combine_bytes(uint32_t a, uint32_t b) {
  static_assert(kCombinesBytewise<OP, T>, "1-byte integers, every op but PRODUCT");
  constexpr uint32_t kHigh = 0x80808080u, kLow = 0x7f7f7f7fu;
  if constexpr (OP == ReduceOp::SUM || OP == ReduceOp::AVG) {
    // The low 7 bits add without a carry out of their byte; bit 7 is the sum
    // of both bits 7 and that carry, the 8-bit wrap.
    return ((a & kLow) + (b & kLow)) ^ ((a ^ b) & kHigh);
  } else if constexpr (OP == ReduceOp::MIN || OP == ReduceOp::MAX) {
    // Compared as unsigned bytes (signed ones with their sign bit flipped).
    const uint32_t flip = std::is_signed_v<T> ? kHigh : 0u;
    const uint32_t x = a ^ flip, y = b ^ flip;
    const uint32_t low_ge = (x | kHigh) - (y & kLow);  // bit 7 of a byte: x's low 7 bits >= y's (no borrow out)
    const uint32_t ge = ((x & ~y) | (~(x ^ y) & low_ge)) & kHigh;  // bit 7 of a byte: x >= y
    const uint32_t a_ge_b = ge | (ge - (ge >> 7));  // 0xff where a >= b (no borrow out of a byte)
    return OP == ReduceOp::MIN ? (b & a_ge_b) | (a & ~a_ge_b) : (a & a_ge_b) | (b & ~a_ge_b);
  } else {
    return OP == ReduceOp::BAND ? (a & b) : OP == ReduceOp::BOR ? (a | b) : (a ^ b);
  }
}

// x / d, truncated, for d >= 1, in 32-bit divisions: a 64-bit division on the
// GPU is a call into a subroutine, and registers held across that call cost
// the kernels that reduce int64 a stack frame. Digits of 16 bits for d < 2^16
// (every rank count), one bit at a time past that. The CPU runs the same code.
FASTPAR_HD uint64_t udiv64_by_32(uint64_t x, uint32_t d) {
  const uint32_t hi = uint32_t(x >> 32), lo = uint32_t(x);
  const uint32_t qh = hi / d;
  uint32_t r = hi - qh * d;  // < d
  if (d < 0x10000u) {
    const uint32_t n1 = (r << 16) | (lo >> 16);  // < d * 2^16: the quotient digit fits 16 bits
    const uint32_t q1 = n1 / d;
    const uint32_t n0 = ((n1 - q1 * d) << 16) | (lo & 0xffffu);
    return (uint64_t(qh) << 32) | (uint64_t(q1) << 16) | uint64_t(n0 / d);
  }
  uint64_t rem = r;
  uint32_t ql = 0;
  for (int i = 31; i >= 0; --i) {
    rem = (rem << 1) | ((lo >> i) & 1u);
    if (rem >= d) {
      rem -= d;
      ql |= 1u << i;
    }
  }
  return (uint64_t(qh) << 32) | ql;
}

// C++'s a / d (truncated toward zero) for a 64-bit a and d >= 1.
FASTPAR_HD int64_t div_by_count(int64_t a, int d) {
  const uint64_t m = a < 0 ? 0 - uint64_t(a) : uint64_t(a);
  const uint64_t q = udiv64_by_32(m, uint32_t(d));
  return a < 0 ? int64_t(0 - q) : int64_t(q);
}

// C++'s a / d (truncated toward zero) for |a| <= 255 and d >= 1, as a 32-bit
// multiply by m = floor((2^16 - 1) / d) + 1: one division, the same for every
// element (a kernel computes it once, where the 16 divisions of a 16-byte
// pack would hold registers enough to spill). Exact: m = (2^16 + e) / d with
// 0 < e <= d, so with |a| = qd + s, |a| m / 2^16 <= q + (d - 1) / d + 255 / 2^16,
// below q + 1 for d <= 256; past that q = 0 and |a| m <= 255 (2^16 / 257 + 1) < 2^16.
FASTPAR_HD int div8_by_count(int a, int d) {
  const uint32_t m = 0xffffu / uint32_t(d) + 1u;
  const int sign = a < 0 ? -1 : 0;
  const uint32_t x = uint32_t((a ^ sign) - sign);
  const int q = int((x * m) >> 16);
  return (q ^ sign) - sign;
}

// Applied once to the fully reduced accumulator: AVG divides by the number of
// contributions (a division, not a multiply by 1/n, so integer-valued sums
// divide exactly as torch's reference does). On integers this is NCCL's
// ncclAvg (its SumPostDiv): the wrapped sum divided by n, truncated toward
// zero. The division is in int or wider (C++'s usual conversions), so a
// uint8/int8 sum is not divided by n wrapped to 8 bits; the 8- and 64-bit
// quotients come from div8_by_count and div_by_count, which equal C++'s.
template <ReduceOp OP, typename A> FASTPAR_HD A finalize(A a, int contributions) {
  if constexpr (OP != ReduceOp::AVG) {
    return a;
  } else if constexpr (std::is_integral_v<A> && sizeof(A) == 8) {
    return A(div_by_count(int64_t(a), contributions));
  } else if constexpr (std::is_integral_v<A> && sizeof(A) == 1) {
    return A(div8_by_count(int(a), contributions));
  } else if constexpr (std::is_integral_v<A>) {
    return A(a / contributions);
  } else {
    return a / A(contributions);
  }
}

inline int dtype_size(DType dt) {
  switch (dt) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: return 2;
    default: return 1;
  }
}

inline const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return "SUM";
    case ReduceOp::AVG: return "AVG";
    case ReduceOp::PRODUCT: return "PRODUCT";
    case ReduceOp::MIN: return "MIN";
    case ReduceOp::MAX: return "MAX";
    case ReduceOp::BAND: return "BAND";
    case ReduceOp::BOR: return "BOR";
    case ReduceOp::BXOR: return "BXOR";
  }
  return "UNKNOWN";
}

inline const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::I8: return "int8";
    case DType::U8: return "uint8";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
  }
  return "unknown";
}

}  // namespace fastpar

// Expands BODY with `scalar_t` bound to the storage type of DT.
#define FASTPAR_DISPATCH_DTYPE(DT, ...)                                       \
  [&] {                                                                       \
    switch (DT) {                                                             \
      case ::fastpar::DType::F32: { using scalar_t = float; return __VA_ARGS__(); }           \
      case ::fastpar::DType::F64: { using scalar_t = double; return __VA_ARGS__(); }          \
      case ::fastpar::DType::F16: { using scalar_t = ::fastpar::f16; return __VA_ARGS__(); }  \
      case ::fastpar::DType::BF16: { using scalar_t = ::fastpar::bf16; return __VA_ARGS__(); } \
      case ::fastpar::DType::I8: { using scalar_t = int8_t; return __VA_ARGS__(); }           \
      case ::fastpar::DType::U8: { using scalar_t = uint8_t; return __VA_ARGS__(); }          \
      case ::fastpar::DType::I32: { using scalar_t = int32_t; return __VA_ARGS__(); }         \
      case ::fastpar::DType::I64: { using scalar_t = int64_t; return __VA_ARGS__(); }         \
    }                                                                         \
  }()

// Expands BODY with `kOp` bound to a compile-time arithmetic ReduceOp (the
// ops the CUDA kernels have; an op outside them expands nothing).
#define FASTPAR_DISPATCH_OP(OP, ...)                                                          \
  [&] {                                                                                       \
    switch (OP) {                                                                             \
      case ::fastpar::ReduceOp::SUM: { constexpr auto kOp = ::fastpar::ReduceOp::SUM; return __VA_ARGS__(); }         \
      case ::fastpar::ReduceOp::AVG: { constexpr auto kOp = ::fastpar::ReduceOp::AVG; return __VA_ARGS__(); }         \
      case ::fastpar::ReduceOp::PRODUCT: { constexpr auto kOp = ::fastpar::ReduceOp::PRODUCT; return __VA_ARGS__(); } \
      case ::fastpar::ReduceOp::MIN: { constexpr auto kOp = ::fastpar::ReduceOp::MIN; return __VA_ARGS__(); }         \
      case ::fastpar::ReduceOp::MAX: { constexpr auto kOp = ::fastpar::ReduceOp::MAX; return __VA_ARGS__(); }         \
      default: break;                                                                         \
    }                                                                                         \
  }()

// FASTPAR_DISPATCH_OP plus the bitwise ops where `scalar_t` (bound by an
// enclosing FASTPAR_DISPATCH_DTYPE) is an integer: the CPU loops' dispatch.
// BODY returns void.
#define FASTPAR_DISPATCH_CPU_OP(OP, ...)                                                                  \
  [&] {                                                                                                   \
    if constexpr (std::is_integral_v<scalar_t>) {                                                        \
      switch (OP) {                                                                                       \
        case ::fastpar::ReduceOp::BAND: { constexpr auto kOp = ::fastpar::ReduceOp::BAND; return __VA_ARGS__(); } \
        case ::fastpar::ReduceOp::BOR: { constexpr auto kOp = ::fastpar::ReduceOp::BOR; return __VA_ARGS__(); }   \
        case ::fastpar::ReduceOp::BXOR: { constexpr auto kOp = ::fastpar::ReduceOp::BXOR; return __VA_ARGS__(); } \
        default: break;                                                                                   \
      }                                                                                                   \
    }                                                                                                     \
    FASTPAR_DISPATCH_OP(OP, __VA_ARGS__);                                                                \
  }()

namespace fastpar {

// Load<T, OP>::run() for every dtype T and every op OP, stopping at the
// first result other than `ok`: that result, else `ok`. How the CUDA IPC
// setup loads every instance of a kernel (cuda_reduce.cu, ipc_fused_one_shot.cu).
template <template <typename, ReduceOp> class Load, class R>
R for_each_kernel(R ok) {
  R result = ok;
  for (int d = 0; d <= int(DType::I64); ++d) {
    for (int o = 0; o <= int(ReduceOp::MAX); ++o) {
      FASTPAR_DISPATCH_DTYPE(DType(d), [&] {
        FASTPAR_DISPATCH_OP(ReduceOp(o), [&] {
          if (result == ok) result = Load<scalar_t, kOp>::run();
        });
      });
    }
  }
  return result;
}

}  // namespace fastpar
