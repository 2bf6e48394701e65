// Many independent memcpys (broadcast, allgather, scatter, gather) run as one
// parallel job: each copy is cut into pieces so that two threads share a single
// large copy as well as many small ones.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_local.h"

namespace fastpar {
namespace cpu_local {

struct CopyJob {
  void* dst;
  const void* src;
  int64_t bytes;
};

// 256 KiB pieces: big enough that a task's overhead is noise, small enough to
// keep both cores busy on a single 1 MiB copy.
constexpr int64_t kCopyPiece = 256 * 1024;

inline void parallel_copy(const ParallelFor& pf, const std::vector<CopyJob>& jobs) {
  std::vector<int64_t> first_piece(jobs.size() + 1, 0);  // prefix sums of piece counts
  for (size_t j = 0; j < jobs.size(); ++j) {
    const int64_t pieces = (jobs[j].bytes + kCopyPiece - 1) / kCopyPiece;
    first_piece[j + 1] = first_piece[j] + pieces;
  }
  const int64_t total = first_piece.back();
  if (total == 0) return;
  pf(0, total, 1, [&](int64_t b, int64_t e) {
    size_t j = 0;
    for (int64_t p = b; p < e; ++p) {
      while (first_piece[j + 1] <= p) ++j;
      const int64_t off = (p - first_piece[j]) * kCopyPiece;
      const int64_t len = std::min(kCopyPiece, jobs[j].bytes - off);
      if (jobs[j].dst != jobs[j].src)
        std::memcpy(static_cast<char*>(jobs[j].dst) + off, static_cast<const char*>(jobs[j].src) + off,
                    size_t(len));
    }
  });
}

}  // namespace cpu_local
}  // namespace fastpar
