// A minimal test harness: CHECK records a failure with file:line and keeps
// going; main returns non-zero if anything failed (ctest reads the exit code).
#pragma once

#include <cstdio>

namespace fastpar_test {
inline int& failures() {
  static int n = 0;
  return n;
}
}  // namespace fastpar_test

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++fastpar_test::failures();                                              \
    }                                                                          \
  } while (0)

#define TEST_MAIN_RESULT()                                                     \
  (fastpar_test::failures() == 0 ? (std::printf("all checks passed\n"), 0)     \
                                 : (std::printf("%d checks failed\n", fastpar_test::failures()), 1))
