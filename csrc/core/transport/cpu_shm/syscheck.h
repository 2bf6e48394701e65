// System-call checking in the style of NCCL's SYSCHECK: retry EINTR, and turn
// any other failure into an exception whose message says what was attempted
// and strerror(errno).
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace fastpar {
namespace cpu_shm {

inline std::string syscall_error(const std::string& what, int err) {
  return "fastpar: " + what + " failed: " + std::strerror(err) + " (errno " + std::to_string(err) + ")";
}

inline int ftruncate_retry(int fd, off_t bytes) {
  int r;
  do {
    r = ftruncate(fd, bytes);
  } while (r != 0 && errno == EINTR);
  return r;
}

}  // namespace cpu_shm
}  // namespace fastpar

// Evaluates EXPR until it does not fail with EINTR; throws if it returns -1.
#define FASTPAR_SYSCHECK(EXPR, WHAT)                                                         \
  [&] {                                                                                      \
    auto fastpar_r = (EXPR);                                                                 \
    while (fastpar_r == -1 && errno == EINTR) fastpar_r = (EXPR);                            \
    if (fastpar_r == -1) throw std::runtime_error(::fastpar::cpu_shm::syscall_error(WHAT, errno)); \
    return fastpar_r;                                                                        \
  }()
