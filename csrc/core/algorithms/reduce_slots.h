// Reduce and reduce-scatter over a slot transport (slot_transport.h; cpu_shm
// and cuda_ipc run these same schedules). Buffers are bytes, `es` the element
// size, counts in elements. One phase per piece each: publish, post, read
// (the one-shot allreduce is reduce_slots with every rank a root).
#pragma once

#include <algorithm>
#include <cstdint>

#include "../transport/collective_call.h"
#include "slot_transport.h"

namespace fastpar {

// Reduce to `root`, or to every rank (root < 0: the one-shot allreduce):
// per slot-sized piece the ranks that send publish their part, one phase,
// and each receiver reduces the n sources in rank order (its own straight
// from `in`), so every receiver produces the same bits. Latency: one flag
// round trip per piece. Outputs of ranks that do not receive are never
// written; `out` may be `in`.
template <class Comm, class Reducer>
void reduce_slots(Comm& c, const CollCall& call, const char* in, char* out, int64_t count, int64_t es, int root,
                  Reducer&& reduce) {
  const int n = c.size(), r = c.rank();
  const bool all = root < 0;
  const int64_t chunk = std::max<int64_t>(1, c.slot_bytes() / es);
  for (int64_t i = 0, np = num_pieces(count, chunk); i < np; ++i) {
    const int64_t cb = i * chunk, len = piece_len(i, chunk, count);
    const int k = c.next_round();
    if (all || r != root) c.publish(c.slot(r, k), in + cb * es, len * es);
    c.phase(call);
    if ((!all && r != root) || len == 0) continue;
    const void* srcs[kMaxShmRanks];
    for (int q = 0; q < n; ++q) srcs[q] = q == r ? static_cast<const void*>(in + cb * es) : c.slot(q, k);
    void* dst[1] = {out + cb * es};
    reduce(srcs, n, dst, 1, len);
  }
}

// Reduce-scatter: ins[q] is the caller's block q (`count` elements; the list
// form passes n tensors, the tensor form one tensor cut in n); rank r's `out`
// gets block r reduced over every rank. A slot is cut into n regions, one per
// destination: per piece each rank publishes the next piece of every block
// q != r in region q, one phase, then reduces its own block's piece from
// region r of every peer's slot (and from its own input).
template <class Comm, class Reducer>
void reduce_scatter_blocks(Comm& c, const CollCall& call, const char* const* ins, char* out, int64_t count,
                           int64_t es, Reducer&& reduce) {
  const int n = c.size(), r = c.rank();
  const int64_t region = region_bytes(c.slot_bytes(), n);
  const int64_t piece = std::max<int64_t>(1, region / es);
  for (int64_t i = 0, np = num_pieces(count, piece); i < np; ++i) {
    const int64_t off = i * piece, len = piece_len(i, piece, count);
    const int k = c.next_round();
    for (int q = 0; q < n; ++q)
      if (q != r) c.publish(c.slot(r, k) + q * region, ins[q] + off * es, len * es);
    c.phase(call);
    if (len == 0) continue;
    const void* srcs[kMaxShmRanks];
    for (int q = 0; q < n; ++q)
      srcs[q] = q == r ? static_cast<const void*>(ins[r] + off * es) : c.slot(q, k) + r * region;
    void* dst[1] = {out + off * es};
    reduce(srcs, n, dst, 1, len);
  }
}

}  // namespace fastpar
