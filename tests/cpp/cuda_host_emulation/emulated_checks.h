// The emulation programs' checks, safe from any rank or block thread: every
// failed expectation is counted and the first 20 are printed; main prints
// "<n> checks, <m> failures", which test_cuda_host_emulation.py reads.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>

inline std::atomic<int64_t> checks{0}, failures{0};

// Built under ThreadSanitizer (test_cuda_host_emulation.py builds the
// threaded programs so too): a desynced call whose ranks cut their data into
// different block ranges lets blocks other than 0 read a peer's slot while the
// peer writes it, before block 0's descriptor check fails the call (the
// output of a failed call is undefined). That race is the design, so under
// ThreadSanitizer those scenarios desync in a way that keeps the cut.
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#else
inline constexpr bool kThreadSanitizer = false;
#endif

inline void expect(bool ok, const char* what) {
  ++checks;
  if (!ok && ++failures <= 20) std::fprintf(stderr, "FAILED %s\n", what);
}
