// The emulation programs' checks, safe from any rank or block thread: every
// failed expectation is counted and the first 20 are printed; main prints
// "<n> checks, <m> failures", which test_cuda_host_emulation.py reads.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>

inline std::atomic<int64_t> checks{0}, failures{0};

inline void expect(bool ok, const char* what) {
  ++checks;
  if (!ok && ++failures <= 20) std::fprintf(stderr, "FAILED %s\n", what);
}
