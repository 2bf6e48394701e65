// The collectives that move bytes without arithmetic (barrier, broadcast,
// allgather, gather, scatter, all-to-all) over a slot transport
// (slot_transport.h; cpu_shm and cuda_ipc run these same schedules).
// Byte-typed: the dtype only matters for the descriptor peers check. Every
// collective runs at least one phase, so even zero-size calls meet their peers
// and get their descriptors checked.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../transport/collective_call.h"
#include "slot_transport.h"

namespace fastpar {

template <class Comm>
void barrier_slots(Comm& c, const CollCall& call) {
  c.phase(call);
}

// `bytes` of `data` from `root` to every rank, in place: per slot-sized piece
// the root publishes it, one phase, every other rank copies it out.
template <class Comm>
void broadcast_slots(Comm& c, const CollCall& call, char* data, int64_t bytes, int root) {
  const int r = c.rank();
  const int64_t B = c.slot_bytes();
  for (int64_t i = 0, np = num_pieces(bytes, B); i < np; ++i) {
    const int64_t off = i * B, len = piece_len(i, B, bytes);
    const int k = c.next_round();
    if (r == root) c.publish(c.slot(r, k), data + off, len);
    c.phase(call);
    if (r != root) c.copy(data + off, c.slot(root, k), len);
  }
}

// outs[q][0, bytes) = rank q's `in`, on every rank (all_gather, root < 0) or
// only on `root` (gather; `outs` is only touched on the root). Per piece: the
// ranks that send publish their piece, one phase, the receivers copy the n-1
// peers' pieces out, and their own block from `in` (not from the slot: `in`
// may alias outs[r]).
template <class Comm>
void gather_slots(Comm& c, const CollCall& call, const char* in, char* const* outs, int64_t bytes, int root) {
  const int n = c.size(), r = c.rank();
  const bool all = root < 0;
  const int64_t B = c.slot_bytes();
  for (int64_t i = 0, np = num_pieces(bytes, B); i < np; ++i) {
    const int64_t off = i * B, len = piece_len(i, B, bytes);
    const int k = c.next_round();
    if (all || r != root) c.publish(c.slot(r, k), in + off, len);
    c.phase(call);
    if (!all && r != root) continue;
    for (int q = 0; q < n; ++q) c.copy(outs[q] + off, q == r ? in + off : c.slot(q, k), len);
  }
}

// Every rank's `mine` (a trivially copyable value), in rank order, on every
// rank: gather_slots to all for one small value, under `call`'s descriptor.
template <class Comm, class T>
std::vector<T> allgather_value(Comm& c, const CollCall& call, const T& mine) {
  const int n = c.size();
  std::vector<T> all(static_cast<size_t>(n));
  std::vector<char*> outs(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) outs[q] = reinterpret_cast<char*>(&all[q]);
  gather_slots(c, call, reinterpret_cast<const char*>(&mine), outs.data(), int64_t(sizeof(T)), -1);
  return all;
}

// Rank q's out[0, bytes) = the root's ins[q] (`ins` is only read on the
// root). A slot holds n regions, one per destination: per piece the root
// publishes the n-1 pieces for its peers, one phase, every other rank copies
// its region out.
template <class Comm>
void scatter_slots(Comm& c, const CollCall& call, const char* const* ins, char* out, int64_t bytes, int root) {
  const int n = c.size(), r = c.rank();
  const int64_t region = region_bytes(c.slot_bytes(), n);
  for (int64_t i = 0, np = num_pieces(bytes, region); i < np; ++i) {
    const int64_t off = i * region, len = piece_len(i, region, bytes);
    const int k = c.next_round();
    if (r == root)
      for (int q = 0; q < n; ++q)
        if (q != r) c.publish(c.slot(r, k) + q * region, ins[q] + off, len);
    c.phase(call);
    c.copy(out + off, r == root ? ins[r] + off : c.slot(root, k) + r * region, len);
  }
}

// All-to-all with equal blocks: rank r's ins[q] (`bytes`) lands in rank q's
// outs[r]. A slot holds n regions, one per destination: per piece each rank
// publishes its n-1 outgoing pieces and copies its own block straight across,
// one phase, then copies its n-1 incoming pieces out. `ins` may alias `outs`
// block for block: a piece is published before the phase that lets peers'
// pieces overwrite it. Sizes never leave the host, so the GPU runs it too;
// ranks with different block sizes differ in the descriptor's count.
template <class Comm>
void alltoall_blocks(Comm& c, const CollCall& call, const char* const* ins, char* const* outs, int64_t bytes) {
  const int n = c.size(), r = c.rank();
  const int64_t region = region_bytes(c.slot_bytes(), n);
  for (int64_t i = 0, np = num_pieces(bytes, region); i < np; ++i) {
    const int64_t off = i * region, len = piece_len(i, region, bytes);
    const int k = c.next_round();
    for (int q = 0; q < n; ++q)
      if (q != r) c.publish(c.slot(r, k) + q * region, ins[q] + off, len);
    c.copy(outs[r] + off, ins[r] + off, len);
    c.phase(call);
    for (int q = 0; q < n; ++q)
      if (q != r) c.copy(outs[q] + off, c.slot(q, k) + r * region, len);
  }
}

// All-to-all with per-peer byte counts (cpu_shm only: the first phase's sizes
// are read by the host): rank r sends in_bytes[q] bytes from in + in_off[q] to
// rank q, which receives them at out + out_off[r]. The first phase publishes
// every rank's send sizes so that (a) each receiver checks that the sizes it
// expects are the sizes sent, and (b) all ranks derive the same number of
// rounds from the largest pair.
template <class Comm>
void alltoall_slots(Comm& c, const CollCall& call, const char* in, const int64_t* in_off, const int64_t* in_bytes,
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
  const int64_t region = region_bytes(c.slot_bytes(), n);
  for (int64_t i = 0, np = num_pieces(most, region); i < np; ++i) {
    const int64_t off = i * region;
    k = c.next_round();
    for (int q = 0; q < n; ++q) {
      const int64_t len = std::max<int64_t>(0, std::min(region, in_bytes[q] - off));
      if (q != r) c.publish(c.slot(r, k) + q * region, in + in_off[q] + off, len);
      else c.copy(out + out_off[r] + off, in + in_off[r] + off, len);
    }
    c.phase(call);
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      const int64_t len = std::max<int64_t>(0, std::min(region, out_bytes[q] - off));
      c.copy(out + out_off[q] + off, c.slot(q, k) + r * region, len);
    }
  }
}

}  // namespace fastpar
