// Which vector instruction set the CPU reduce loops use, chosen once per
// process at run time (the extension is built for plain x86-64, so one binary
// runs on every machine and still uses AVX-512 where it exists).
//
// Every choice gives the same bits (see cpu_reduce_simd.h), so ranks on
// different machines may pick differently. The torch layer may force a
// choice (FASTPAR_CPU_ISA=scalar|avx2|avx512|avx512_bf16, read in
// torch/distributed/knobs.cpp: benchmarks, tests, bisecting); asking for more
// than the CPU has is an error, not a silent fallback.
#pragma once

#include <atomic>
#include <stdexcept>
#include <string>

namespace fastpar {

// Each level has every instruction of the ones below it.
enum class CpuIsa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };

inline const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx512Bf16: return "avx512_bf16";
    default: return "scalar";
  }
}

#if defined(__x86_64__) && !defined(__CUDACC__) && (defined(__GNUC__) || defined(__clang__))
#define FASTPAR_X86_SIMD 1
#else
#define FASTPAR_X86_SIMD 0
#endif

// The best the CPU (and OS: __builtin_cpu_supports checks XCR0 state) offers.
// AVX2 needs F16C for the fp16 conversions; AVX-512 needs BW/VL for 16-bit
// lanes; AVX512-BF16 (the fp32 -> bf16 conversion in one instruction) needs DQ
// for VFPCLASSPS, which finds the subnormals that instruction would flush.
inline CpuIsa cpu_isa_supported() {
#if FASTPAR_X86_SIMD
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) {
    if (__builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bf16")) return CpuIsa::kAvx512Bf16;
    return CpuIsa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) return CpuIsa::kAvx2;
#endif
  return CpuIsa::kScalar;
}

// The ISA forced by use_cpu_isa, or -1.
inline std::atomic<int>& forced_cpu_isa() {
  static std::atomic<int> isa{-1};
  return isa;
}

// The ISA the reduce loops use: the forced one, else the best supported.
inline CpuIsa cpu_isa() {
  static const CpuIsa best = cpu_isa_supported();
  const int forced = forced_cpu_isa().load(std::memory_order_relaxed);
  return forced < 0 ? best : CpuIsa(forced);
}

// "auto" (the best supported), "scalar", "avx2", "avx512" or "avx512_bf16";
// `what` names the setting in the errors.
inline void use_cpu_isa(const std::string& name, const std::string& what) {
  const CpuIsa best = cpu_isa_supported();
  CpuIsa want = best;
  if (name == "scalar") want = CpuIsa::kScalar;
  else if (name == "avx2") want = CpuIsa::kAvx2;
  else if (name == "avx512") want = CpuIsa::kAvx512;
  else if (name == "avx512_bf16") want = CpuIsa::kAvx512Bf16;
  else if (name != "auto" && !name.empty())
    throw std::invalid_argument("fastpar: " + what + " is '" + name +
                                "' but must be 'auto', 'scalar', 'avx2', 'avx512' or 'avx512_bf16'");
  if (int(want) > int(best))
    throw std::invalid_argument("fastpar: " + what + " is '" + name + "' but this CPU supports at most '" +
                                cpu_isa_name(best) + "'");
  forced_cpu_isa().store(int(want), std::memory_order_relaxed);
}

}  // namespace fastpar
