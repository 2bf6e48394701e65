// Reduce and reduce-scatter over a multi-process slot transport (see
// allreduce_shm.h for the Comm interface). One phase per chunk each.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../kernels/cpu_reduce.h"
#include "collective_call.h"

namespace fastpar {

// Reduce to `root`: every other rank publishes a chunk, the root reduces all n
// (its own straight from `in`) into `out`. Non-root outputs are not written.
template <typename T, ReduceOp OP, class Comm>
void reduce_to_root(Comm& c, const CollCall& call, const T* in, T* out, int64_t count, int root) {
  const int n = c.size(), r = c.rank();
  const int64_t chunk = c.slot_bytes() / int64_t(sizeof(T));
  const int64_t nchunks = std::max<int64_t>(1, (count + chunk - 1) / chunk);
  for (int64_t ci = 0; ci < nchunks; ++ci) {
    const int64_t cb = ci * chunk, len = std::max<int64_t>(0, std::min(chunk, count - cb));
    const int k = c.next_round();
    if (r != root) std::memcpy(c.slot(r, k), in + cb, size_t(len) * sizeof(T));
    c.phase(call);
    if (r != root) continue;
    const T* srcs[kMaxShmRanks];
    for (int q = 0; q < n; ++q) srcs[q] = q == r ? in + cb : reinterpret_cast<const T*>(c.slot(q, k));
    T* dst = out + cb;
    cpu_reduce_range<T, OP>(srcs, n, &dst, 1, 0, len, n);
  }
}

// Reduce-scatter: `in` holds n blocks of `count`; rank r gets block r reduced.
// A slot is cut into n regions; per round rank r publishes, for every q != r,
// the next piece of block q in region q, then reduces its own block's piece
// from region r of every peer (and its own input).
template <typename T, ReduceOp OP, class Comm>
void reduce_scatter_blocks(Comm& c, const CollCall& call, const T* in, T* out, int64_t count) {
  const int n = c.size(), r = c.rank();
  const int64_t region = c.slot_bytes() / n / int64_t(sizeof(T)) / 16 * 16;  // 64 B-aligned regions (f32)
  const int64_t piece = std::max<int64_t>(1, region);
  const int64_t rounds = std::max<int64_t>(1, (count + piece - 1) / piece);
  for (int64_t i = 0; i < rounds; ++i) {
    const int64_t off = i * piece, len = std::max<int64_t>(0, std::min(piece, count - off));
    const int k = c.next_round();
    T* mine = reinterpret_cast<T*>(c.slot(r, k));
    for (int q = 0; q < n; ++q)
      if (q != r) std::memcpy(mine + q * piece, in + q * count + off, size_t(len) * sizeof(T));
    c.phase(call);
    const T* srcs[kMaxShmRanks];
    for (int q = 0; q < n; ++q)
      srcs[q] = q == r ? in + r * count + off : reinterpret_cast<const T*>(c.slot(q, k)) + r * piece;
    T* dst = out + off;
    cpu_reduce_range<T, OP>(srcs, n, &dst, 1, 0, len, n);
  }
}

}  // namespace fastpar
