// Allreduce over a slot transport (slot_transport.h: the Comm and Reducer
// interfaces; cpu_shm and cuda_ipc run these same schedules). Buffers are
// bytes, `es` the element size; counts and shard bounds are in elements. See
// docs/algorithms.md for steps and bytes moved.
//
// Every output element is produced by the Reducer over ranks 0..n-1 in that
// order, by exactly one rank (two-shot) or identically by all (one-shot), so
// every rank ends with the same bits.
#pragma once

#include <algorithm>
#include <cstdint>

#include "../transport/collective_call.h"
#include "reduce_slots.h"
#include "ring_schedule.h"  // split_range
#include "slot_transport.h"

namespace fastpar {

// One-shot: per slot-sized chunk, copy in, one phase, every rank reduces all
// n slots (reduce_slots with every rank a root, root < 0). Latency: one flag
// round trip per chunk (the front ends pick it for messages that fit one
// slot). `out` may be `in`.
template <class Comm, class Reducer>
void allreduce_one_shot(Comm& c, const CollCall& call, const char* in, char* out, int64_t count, int64_t es,
                        Reducer&& reduce) {
  reduce_slots(c, call, in, out, count, es, /*root=*/-1, reduce);
}

// Two-shot (reduce-scatter then allgather) in chunks of a slot, pipelined over
// the rotating slots so that a chunk costs one phase, not two: after phase
// P(k) a rank copies out chunk k-1's final shards (published with P(k)),
// reduces its shard of chunk k (from every rank's slot, into its own slot and
// its output), and publishes chunk k+1's input shards, all before posting
// P(k+1). m chunks take m+1 phases and three rotating slots (a chunk's slot is
// read until the phase after the one that published it). Each rank reads
// 2(n-1)/n of the data instead of n-1 times it. `out` may be `in`.
static_assert(flags::kSlots >= 3, "the pipelined two-shot needs 3 rotating slots");

template <class Comm, class Reducer>
void allreduce_two_shot(Comm& c, const CollCall& call, const char* in, char* out, int64_t count, int64_t es,
                        Reducer&& reduce) {
  const int n = c.size(), r = c.rank();
  const int64_t al = shard_align(es);
  const int64_t chunk = std::max<int64_t>(1, c.slot_bytes() / es);
  const int64_t m = num_pieces(count, chunk);
  auto bounds = [&](int64_t k) { return Range{k * chunk, std::min(count, k * chunk + chunk)}; };
  auto publish = [&](int64_t k, int slot) {  // input shards q != r of chunk k
    const Range ch = bounds(k);
    char* mine = c.slot(r, slot);
    for (int q = 0; q < n; ++q) {
      const Range s = split_range(ch.begin, ch.end, n, q, al);
      if (q != r) c.publish(mine + (s.begin - ch.begin) * es, in + s.begin * es, s.size() * es);
    }
  };
  auto copy_out = [&](int64_t k, int slot) {  // final shards q != r of chunk k
    const Range ch = bounds(k);
    for (int q = 0; q < n; ++q) {
      const Range s = split_range(ch.begin, ch.end, n, q, al);
      if (q != r) c.copy(out + s.begin * es, c.slot(q, slot) + (s.begin - ch.begin) * es, s.size() * es);
    }
  };
  int cur = c.next_round(), prev = -1;
  publish(0, cur);
  for (int64_t k = 0; k < m; ++k) {
    c.phase(call);
    if (k > 0) copy_out(k - 1, prev);
    const Range ch = bounds(k);
    const Range mr = split_range(ch.begin, ch.end, n, r, al);
    if (mr.size() > 0) {
      const void* srcs[kMaxShmRanks];
      for (int q = 0; q < n; ++q)
        srcs[q] = q == r ? static_cast<const void*>(in + mr.begin * es) : c.slot(q, cur) + (mr.begin - ch.begin) * es;
      void* dsts[2] = {c.slot(r, cur) + (mr.begin - ch.begin) * es, out + mr.begin * es};
      reduce(srcs, n, dsts, 2, mr.size());
    }
    prev = cur;
    if (k + 1 < m) {
      cur = c.next_round();
      publish(k + 1, cur);
    }
  }
  c.phase(call);
  copy_out(m - 1, prev);
}

// Two-shot on registered buffers (Comm::arena(q): rank q's registered region,
// as mapped here; the cpu_shm segment's arena, the CUDA IPC arena's registered
// region): the data already sits at `offset` in every rank's region, so there
// is no copy-in. Pipelined over chunks of `chunk`
// elements like allreduce_two_shot: after phase P(k) a rank copies chunk k-1's
// final shards from their owners and reduces its shard of chunk k in place
// (only rank r ever reads or writes shard r of any arena before its reduce).
// Chunking lets a peer copy a shard out while the owner's writes to it are
// still in cache (unchunked measured slower: docs/measurements.md). The last phase
// keeps the buffer from going back to the caller while a peer still copies our
// shard out of it. m chunks take m+2 phases.
template <class Comm, class Reducer>
void allreduce_registered(Comm& c, const CollCall& call, int64_t offset, int64_t count, int64_t es, int64_t chunk,
                          Reducer&& reduce) {
  const int n = c.size(), r = c.rank();
  const int64_t al = shard_align(es);
  const int64_t m = num_pieces(count, chunk);
  auto buf = [&](int q) { return c.arena(q) + offset; };
  char* mine = buf(r);
  auto bounds = [&](int64_t k) { return Range{k * chunk, std::min(count, k * chunk + chunk)}; };
  auto copy_out = [&](int64_t k) {  // final shards q != r of chunk k
    const Range ch = bounds(k);
    for (int q = 0; q < n; ++q) {
      const Range s = split_range(ch.begin, ch.end, n, q, al);
      if (q != r) c.copy(mine + s.begin * es, buf(q) + s.begin * es, s.size() * es);
    }
  };
  for (int64_t k = 0; k < m; ++k) {
    c.phase(call);
    if (k > 0) copy_out(k - 1);
    const Range ch = bounds(k);
    const Range mr = split_range(ch.begin, ch.end, n, r, al);
    if (mr.size() == 0) continue;
    const void* srcs[kMaxShmRanks];
    for (int q = 0; q < n; ++q) srcs[q] = buf(q) + mr.begin * es;
    void* dst[1] = {mine + mr.begin * es};
    reduce(srcs, n, dst, 1, mr.size());
  }
  c.phase(call);
  copy_out(m - 1);
  c.phase(call);
}

// registered_empty's agreement: this rank allocated `bytes` at `offset` of its
// registered region (RegisteredArena: the same first-fit bookkeeping, called
// in the same order, gives every rank the same offset) or found no room
// (offset < 0). One phase compares the descriptors, so ranks that allocated in
// different orders, or where only some ran out, fail together now instead of
// reducing different buffers later.
template <class Comm>
void agree_registered(Comm& c, int64_t bytes, int64_t offset) {
  c.phase(CollCall{Coll::kRegister, bytes, DType::U8, -1, -1, offset >= 0 ? offset : kAuxNoFit});
}

}  // namespace fastpar
