// Allreduce over a multi-process transport whose ranks can read each other's
// slots (cpu_shm; the CUDA IPC path has the same shape). The Comm interface:
//   rank(), size(), slot(q, k), slot_bytes(), arena(q), next_round(), phase(call)
// See docs/algorithms.md for steps and bytes moved.
//
// Every output element is produced by cpu_reduce_range over ranks 0..n-1 in
// that order, by exactly one rank (two-shot) or identically by all (one-shot),
// so every rank ends with the same bits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../kernels/cpu_reduce.h"
#include "collective_call.h"
#include "ring_schedule.h"  // split_range

namespace fastpar {

// Shards start on 64-byte boundaries: no two ranks write one cache line.
template <typename T> constexpr int64_t shard_align() { return 64 / int64_t(sizeof(T)); }

// One-shot: copy in, one phase, every rank reduces all n slots. For messages
// that fit a slot; latency is one flag round trip.
template <typename T, ReduceOp OP, class Comm>
void allreduce_one_shot(Comm& c, const CollCall& call, const T* in, T* out, int64_t count) {
  const int n = c.size(), r = c.rank();
  const int k = c.next_round();
  std::memcpy(c.slot(r, k), in, size_t(count) * sizeof(T));
  c.phase(call);
  const T* srcs[kMaxShmRanks];
  for (int q = 0; q < n; ++q) srcs[q] = q == r ? in : reinterpret_cast<const T*>(c.slot(q, k));
  T* dst = out;
  cpu_reduce_range<T, OP>(srcs, n, &dst, 1, 0, count, n);
}

// Two-shot (reduce-scatter then allgather) in chunks of `chunk` elements, each
// chunk through the next rotating slot: rank r publishes the shards q != r of
// the chunk, reduces shard r from all ranks into its slot and its output, then
// copies the other final shards from their owners. Memory: one slot per round.
template <typename T, ReduceOp OP, class Comm>
void allreduce_two_shot(Comm& c, const CollCall& call, const T* in, T* out, int64_t count, int64_t chunk) {
  const int n = c.size(), r = c.rank();
  const int64_t al = shard_align<T>();
  const int64_t nchunks = std::max<int64_t>(1, (count + chunk - 1) / chunk);
  for (int64_t ci = 0; ci < nchunks; ++ci) {
    const int64_t cb = ci * chunk, ce = std::min(count, cb + chunk);
    const int k = c.next_round();
    T* mine_slot = reinterpret_cast<T*>(c.slot(r, k));
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      const Range s = split_range(cb, ce, n, q, al);
      std::memcpy(mine_slot + (s.begin - cb), in + s.begin, size_t(s.size()) * sizeof(T));
    }
    c.phase(call);
    const Range m = split_range(cb, ce, n, r, al);
    const T* srcs[kMaxShmRanks];
    for (int q = 0; q < n; ++q)
      srcs[q] = q == r ? in + m.begin : reinterpret_cast<const T*>(c.slot(q, k)) + (m.begin - cb);
    T* dsts[2] = {mine_slot + (m.begin - cb), out + m.begin};
    cpu_reduce_range<T, OP>(srcs, n, dsts, 2, 0, m.size(), n);
    c.phase(call);
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      const Range s = split_range(cb, ce, n, q, al);
      std::memcpy(out + s.begin, reinterpret_cast<const T*>(c.slot(q, k)) + (s.begin - cb),
                  size_t(s.size()) * sizeof(T));
    }
  }
}

// Two-shot on registered buffers: the data already sits at `offset` in every
// rank's arena, so there is no copy-in and no chunking. Shard r is reduced in
// place (only rank r reads shard r of any arena in that step). The third phase
// keeps the buffer from going back to the caller while a peer still copies our
// shard out of it.
template <typename T, ReduceOp OP, class Comm>
void allreduce_registered(Comm& c, const CollCall& call, int64_t offset, int64_t count) {
  const int n = c.size(), r = c.rank();
  const Range m = split_range(0, count, n, r, shard_align<T>());
  c.phase(call);
  const T* srcs[kMaxShmRanks];
  for (int q = 0; q < n; ++q) srcs[q] = reinterpret_cast<const T*>(c.arena(q) + offset) + m.begin;
  T* mine = reinterpret_cast<T*>(c.arena(r) + offset);
  T* dst = mine + m.begin;
  cpu_reduce_range<T, OP>(srcs, n, &dst, 1, 0, m.size(), n);
  c.phase(call);
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    const Range s = split_range(0, count, n, q, shard_align<T>());
    std::memcpy(mine + s.begin, reinterpret_cast<const T*>(c.arena(q) + offset) + s.begin,
                size_t(s.size()) * sizeof(T));
  }
  c.phase(call);
}

}  // namespace fastpar
