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

// Two-shot (reduce-scatter then allgather) in chunks of `chunk` elements,
// pipelined over the rotating slots so that a chunk costs one phase, not two:
// after phase P(k) a rank copies out chunk k-1's final shards (published with
// P(k)), reduces its shard of chunk k (from every rank's slot, into its own
// slot and its output), and publishes chunk k+1's input shards, all before
// posting P(k+1). m chunks take m+1 phases. Memory: 3 slots per rank.
template <typename T, ReduceOp OP, class Comm>
void allreduce_two_shot(Comm& c, const CollCall& call, const T* in, T* out, int64_t count, int64_t chunk) {
  const int n = c.size(), r = c.rank();
  const int64_t al = shard_align<T>();
  const int64_t m = std::max<int64_t>(1, (count + chunk - 1) / chunk);
  auto bounds = [&](int64_t k) { return Range{k * chunk, std::min(count, k * chunk + chunk)}; };
  auto publish = [&](int64_t k, int slot) {  // input shards q != r of chunk k
    const Range ch = bounds(k);
    T* mine = reinterpret_cast<T*>(c.slot(r, slot));
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      const Range s = split_range(ch.begin, ch.end, n, q, al);
      std::memcpy(mine + (s.begin - ch.begin), in + s.begin, size_t(s.size()) * sizeof(T));
    }
  };
  auto copy_out = [&](int64_t k, int slot) {  // final shards q != r of chunk k
    const Range ch = bounds(k);
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      const Range s = split_range(ch.begin, ch.end, n, q, al);
      std::memcpy(out + s.begin, reinterpret_cast<const T*>(c.slot(q, slot)) + (s.begin - ch.begin),
                  size_t(s.size()) * sizeof(T));
    }
  };
  int cur = c.next_round(), prev = -1;
  publish(0, cur);
  for (int64_t k = 0; k < m; ++k) {
    c.phase(call);
    if (k > 0) copy_out(k - 1, prev);
    const Range ch = bounds(k);
    const Range mr = split_range(ch.begin, ch.end, n, r, al);
    const T* srcs[kMaxShmRanks];
    for (int q = 0; q < n; ++q)
      srcs[q] = q == r ? in + mr.begin : reinterpret_cast<const T*>(c.slot(q, cur)) + (mr.begin - ch.begin);
    T* dsts[2] = {reinterpret_cast<T*>(c.slot(r, cur)) + (mr.begin - ch.begin), out + mr.begin};
    cpu_reduce_range<T, OP>(srcs, n, dsts, 2, 0, mr.size(), n);
    prev = cur;
    if (k + 1 < m) {
      cur = c.next_round();
      publish(k + 1, cur);
    }
  }
  c.phase(call);
  copy_out(m - 1, prev);
}

// Two-shot on registered buffers: the data already sits at `offset` in every
// rank's arena, so there is no copy-in. Pipelined over chunks of `chunk`
// elements like allreduce_two_shot: after phase P(k) a rank copies chunk k-1's
// final shards from their owners and reduces its shard of chunk k in place
// (only rank r ever reads or writes shard r of any arena before its reduce).
// Chunking lets a peer copy a shard out while the owner's writes to it are
// still in cache (unchunked was 1.2-1.4x slower at 64-256 MiB). The last phase
// keeps the buffer from going back to the caller while a peer still copies our
// shard out of it. m chunks take m+2 phases.
template <typename T, ReduceOp OP, class Comm>
void allreduce_registered(Comm& c, const CollCall& call, int64_t offset, int64_t count, int64_t chunk) {
  const int n = c.size(), r = c.rank();
  const int64_t al = shard_align<T>();
  const int64_t m = std::max<int64_t>(1, (count + chunk - 1) / chunk);
  auto buf = [&](int q) { return reinterpret_cast<T*>(c.arena(q) + offset); };
  T* mine = buf(r);
  auto bounds = [&](int64_t k) { return Range{k * chunk, std::min(count, k * chunk + chunk)}; };
  auto copy_out = [&](int64_t k) {  // final shards q != r of chunk k
    const Range ch = bounds(k);
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      const Range s = split_range(ch.begin, ch.end, n, q, al);
      std::memcpy(mine + s.begin, buf(q) + s.begin, size_t(s.size()) * sizeof(T));
    }
  };
  for (int64_t k = 0; k < m; ++k) {
    c.phase(call);
    if (k > 0) copy_out(k - 1);
    const Range ch = bounds(k);
    const Range mr = split_range(ch.begin, ch.end, n, r, al);
    const T* srcs[kMaxShmRanks];
    for (int q = 0; q < n; ++q) srcs[q] = buf(q) + mr.begin;
    T* dst = mine + mr.begin;
    cpu_reduce_range<T, OP>(srcs, n, &dst, 1, 0, mr.size(), n);
  }
  c.phase(call);
  copy_out(m - 1);
  c.phase(call);
}

}  // namespace fastpar
