// The collectives that move bytes without arithmetic (broadcast, allgather,
// gather, scatter, all-to-all, barrier) over a multi-process slot transport
// (Comm interface: see allreduce_shm.h). Byte-typed: dtype only matters for the
// descriptor peers check. Every collective runs at least one phase, so even
// zero-size calls meet their peers and get their descriptors checked.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "collective_call.h"

namespace fastpar {

inline int64_t num_pieces(int64_t bytes, int64_t piece) {
  return std::max<int64_t>(1, (bytes + piece - 1) / piece);
}

template <class Comm>
void barrier_shm(Comm& c, const CollCall& call) {
  c.phase(call);
}

// Root publishes slot-sized pieces; everyone else copies them out.
template <class Comm>
void broadcast_shm(Comm& c, const CollCall& call, char* data, int64_t bytes, int root) {
  const int r = c.rank();
  const int64_t B = c.slot_bytes();
  for (int64_t i = 0, np = num_pieces(bytes, B); i < np; ++i) {
    const int64_t off = i * B, len = std::max<int64_t>(0, std::min(B, bytes - off));
    const int k = c.next_round();
    if (r == root) std::memcpy(c.slot(r, k), data + off, size_t(len));
    c.phase(call);
    if (r != root) std::memcpy(data + off, c.slot(root, k), size_t(len));
  }
}

// out[q * bytes ...] = rank q's `in`, on every rank (all_gather) or only on
// `root` (gather, root >= 0; then `out` is only touched on the root).
template <class Comm>
void gather_shm(Comm& c, const CollCall& call, const char* in, char* const* outs, int64_t bytes, int root) {
  const int n = c.size(), r = c.rank();
  const bool all = root < 0;
  const int64_t B = c.slot_bytes();
  for (int64_t i = 0, np = num_pieces(bytes, B); i < np; ++i) {
    const int64_t off = i * B, len = std::max<int64_t>(0, std::min(B, bytes - off));
    const int k = c.next_round();
    if (all || r != root) std::memcpy(c.slot(r, k), in + off, size_t(len));
    c.phase(call);
    if (!all && r != root) continue;
    for (int q = 0; q < n; ++q)
      std::memcpy(outs[q] + off, q == r ? in + off : c.slot(q, k), size_t(len));
  }
}

// Rank q gets ins[q] of the root (`ins` only read on the root). A slot holds n
// regions, one per destination.
template <class Comm>
void scatter_shm(Comm& c, const CollCall& call, const char* const* ins, char* out, int64_t bytes, int root) {
  const int n = c.size(), r = c.rank();
  const int64_t region = c.slot_bytes() / n;
  for (int64_t i = 0, np = num_pieces(bytes, region); i < np; ++i) {
    const int64_t off = i * region, len = std::max<int64_t>(0, std::min(region, bytes - off));
    const int k = c.next_round();
    if (r == root)
      for (int q = 0; q < n; ++q)
        if (q != r) std::memcpy(c.slot(r, k) + q * region, ins[q] + off, size_t(len));
    c.phase(call);
    std::memcpy(out + off, r == root ? ins[r] + off : c.slot(root, k) + r * region, size_t(len));
  }
}

// All-to-all with per-peer byte counts: rank r sends in_bytes[q] bytes from
// in + in_off[q] to rank q, which receives them at out + out_off[r]. A first
// phase publishes every rank's send sizes so that (a) each receiver checks that
// the sizes it expects are the sizes sent, and (b) all ranks derive the same
// number of rounds from the largest pair.
template <class Comm>
void alltoall_shm(Comm& c, const CollCall& call, const char* in, const int64_t* in_off, const int64_t* in_bytes,
                  char* out, const int64_t* out_off, const int64_t* out_bytes) {
  const int n = c.size(), r = c.rank();
  int k = c.next_round();
  std::memcpy(c.slot(r, k), in_bytes, sizeof(int64_t) * size_t(n));
  c.phase(call);
  int64_t most = 0;
  for (int q = 0; q < n; ++q) {
    const int64_t* sent = reinterpret_cast<const int64_t*>(c.slot(q, k));
    for (int p = 0; p < n; ++p) most = std::max(most, sent[p]);
    if (sent[r] != out_bytes[q])
      c.fail("fastpar: alltoall on rank " + std::to_string(c.global_rank(r)) + ": rank " +
             std::to_string(c.global_rank(q)) + " sends " + std::to_string(sent[r]) +
             " bytes to this rank but output split " + std::to_string(q) + " expects " +
             std::to_string(out_bytes[q]) + " bytes");
  }
  const int64_t region = c.slot_bytes() / n;
  for (int64_t i = 0, np = num_pieces(most, region); i < np; ++i) {
    const int64_t off = i * region;
    k = c.next_round();
    for (int q = 0; q < n; ++q) {
      const int64_t len = std::max<int64_t>(0, std::min(region, in_bytes[q] - off));
      if (q != r) std::memcpy(c.slot(r, k) + q * region, in + in_off[q] + off, size_t(len));
      else std::memcpy(out + out_off[r] + off, in + in_off[r] + off, size_t(len));
    }
    c.phase(call);
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      const int64_t len = std::max<int64_t>(0, std::min(region, out_bytes[q] - off));
      std::memcpy(out + out_off[q] + off, c.slot(q, k) + r * region, size_t(len));
    }
  }
}

}  // namespace fastpar
