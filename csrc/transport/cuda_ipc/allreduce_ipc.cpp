// Host schedules of allreduce_ipc.h. They mirror algorithms/allreduce_shm.h
// step for step (same shard cut, same slot rotation, same phases), with
// memcpy -> cudaMemcpyAsync, cpu_reduce_range -> the shared reduce kernel and
// Comm::phase -> launch_phase. Host code only: tests/cpp/cuda_host_emulation
// runs these schedules with one thread per rank.
#include "allreduce_ipc.h"

#include <algorithm>

#include "../../algorithms/ring_schedule.h"  // split_range
#include "../../kernels/cuda_reduce_launch.h"
#include "../cuda_p2p/cuda_try.h"
#include "fused_one_shot.h"
#include "ipc_steps.h"

namespace fastpar {
namespace cuda_ipc {
namespace {

using ipc_steps::at;
using ipc_steps::check_comm;
using ipc_steps::guarded_copy;
using ipc_steps::next_round;
using ipc_steps::reduce;

// Shards start on 64-byte boundaries, as in allreduce_shm.h: no two ranks
// write one cache line, and every shard keeps the 16-byte alignment of its buffer.
int64_t shard_align(int64_t ts) { return std::max<int64_t>(1, 64 / ts); }

cudaError_t phase(IpcComm& c, IpcOp op, DType dt, ReduceOp rop, int64_t count, cudaStream_t stream) {
  return ipc_steps::phase(c, op, int32_t(dt), int32_t(rop), count, -1, stream);
}

}  // namespace

cudaError_t allreduce_one_shot(IpcComm& c, DType dt, ReduceOp op, const void* in, void* out, int64_t count,
                               cudaStream_t stream) {
  FASTPAR_CUDA_TRY(check_comm(c));
  const int n = c.size, r = c.rank;
  const int64_t ts = dtype_size(dt);
  const int64_t chunk = std::max<int64_t>(1, int64_t(c.slot_bytes) / ts);
  cuda_p2p::DeviceRestore restore;
  FASTPAR_CUDA_TRY(cudaSetDevice(c.device));
  if (c.fused_one_shot && count > 0 && count <= chunk) {
    // One launch instead of three (fused_one_shot.h).
    const int k = next_round(c);
    FusedArgs a{};
    a.phase = ipc_steps::phase_args(c, IpcOp::kAllreduceFused, int32_t(dt), int32_t(op), count, -1);
    a.self_blocks = block_flags_of(c.bases[r]);
    for (int q = 0; q < n; ++q) {
      a.peer_blocks[q] = block_flags_of(c.bases[q]);
      a.slots[q] = slot_of(c.bases[q], c.slot_bytes, k);
    }
    a.in = in;
    a.out = out;
    a.count = count;
    a.contributions = n;
    a.nblocks = fused_blocks(count * ts, c.fused_bytes_per_block);
    return launch_fused_one_shot(dt, op, a, stream);
  }
  for (int64_t cb = 0; cb < count; cb += chunk) {
    const int64_t len = std::min(chunk, count - cb);
    const int k = next_round(c);
    FASTPAR_CUDA_TRY(cudaMemcpyAsync(slot_of(c.bases[r], c.slot_bytes, k), at(in, cb, ts), size_t(len * ts),
                                     cudaMemcpyDeviceToDevice, stream));
    FASTPAR_CUDA_TRY(phase(c, IpcOp::kAllreduceOneShot, dt, op, count, stream));
    const void* srcs[kMaxIpcRanks];
    for (int q = 0; q < n; ++q) srcs[q] = q == r ? at(in, cb, ts) : slot_of(c.bases[q], c.slot_bytes, k);
    void* dst[1] = {at(out, cb, ts)};
    FASTPAR_CUDA_TRY(reduce(c, dt, op, srcs, n, dst, 1, len, n, stream));
  }
  return cudaSuccess;
}

cudaError_t allreduce_graphed(IpcComm& c, DType dt, ReduceOp op, const void* in, void* out, int64_t count,
                              cudaStream_t stream) {
  FASTPAR_CUDA_TRY(check_comm(c));
  const int n = c.size, r = c.rank;
  const int64_t ts = dtype_size(dt);
  if (count < 1 || count * ts > int64_t(c.slot_bytes)) return cudaErrorInvalidValue;
  cuda_p2p::DeviceRestore restore;
  FASTPAR_CUDA_TRY(cudaSetDevice(c.device));
  GraphArgs a{};
  // The descriptor's seq is not used (each block's epoch is), and c.seq is
  // not advanced: graphed calls are outside the eager phase numbering.
  a.f.phase = ipc_steps::phase_args_at(c, IpcOp::kAllreduceGraphed, int32_t(dt), int32_t(op), count, -1, 0);
  a.self = graph_control_of(c.bases[r], c.slot_bytes);
  for (int q = 0; q < n; ++q) {
    a.peers[q] = graph_control_of(c.bases[q], c.slot_bytes);
    a.f.slots[q] = graph_slot_of(c.bases[q], c.slot_bytes);
  }
  a.f.in = in;
  a.f.out = out;
  a.f.count = count;
  a.f.contributions = n;
  a.f.nblocks = fused_blocks(count * ts, c.fused_bytes_per_block);
  return launch_fused_graph(dt, op, a, stream);
}

// Pipelined as allreduce_shm.h's two-shot: after phase P(k) a rank copies out
// chunk k-1's final shards, reduces its shard of chunk k and publishes chunk
// k+1's input shards, all before posting P(k+1): m chunks take m+1 phases and
// three rotating slots (a chunk's slot is read until the phase after the one
// that published it).
static_assert(flags::kSlots >= 3, "the pipelined two-shot needs 3 rotating slots");

cudaError_t allreduce_two_shot(IpcComm& c, DType dt, ReduceOp op, const void* in, void* out, int64_t count,
                               cudaStream_t stream) {
  FASTPAR_CUDA_TRY(check_comm(c));
  const int n = c.size, r = c.rank;
  const int64_t ts = dtype_size(dt);
  const int64_t al = shard_align(ts);
  const int64_t chunk = std::max<int64_t>(1, int64_t(c.slot_bytes) / ts);
  const int64_t m = std::max<int64_t>(1, (count + chunk - 1) / chunk);
  cuda_p2p::DeviceRestore restore;
  FASTPAR_CUDA_TRY(cudaSetDevice(c.device));
  auto bounds = [&](int64_t k) { return Range{k * chunk, std::min(count, k * chunk + chunk)}; };
  auto publish = [&](int64_t k, int slot) -> cudaError_t {  // input shards q != r of chunk k
    const Range ch = bounds(k);
    char* mine = slot_of(c.bases[r], c.slot_bytes, slot);
    for (int q = 0; q < n; ++q) {
      const Range s = split_range(ch.begin, ch.end, n, q, al);
      if (q == r || s.size() == 0) continue;
      FASTPAR_CUDA_TRY(cudaMemcpyAsync(mine + (s.begin - ch.begin) * ts, at(in, s.begin, ts), size_t(s.size() * ts),
                                       cudaMemcpyDeviceToDevice, stream));
    }
    return cudaSuccess;
  };
  auto copy_out = [&](int64_t k, int slot) -> cudaError_t {  // final shards q != r of chunk k
    const Range ch = bounds(k);
    for (int q = 0; q < n; ++q) {
      const Range s = split_range(ch.begin, ch.end, n, q, al);
      if (q == r || s.size() == 0) continue;
      FASTPAR_CUDA_TRY(guarded_copy(c, at(out, s.begin, ts),
                                    slot_of(c.bases[q], c.slot_bytes, slot) + (s.begin - ch.begin) * ts,
                                    s.size() * ts, stream));
    }
    return cudaSuccess;
  };
  int cur = next_round(c), prev = -1;
  FASTPAR_CUDA_TRY(publish(0, cur));
  for (int64_t k = 0; k < m; ++k) {
    FASTPAR_CUDA_TRY(phase(c, IpcOp::kAllreduceTwoShot, dt, op, count, stream));
    if (k > 0) FASTPAR_CUDA_TRY(copy_out(k - 1, prev));
    const Range ch = bounds(k);
    const Range mr = split_range(ch.begin, ch.end, n, r, al);
    const void* srcs[kMaxIpcRanks];
    for (int q = 0; q < n; ++q)
      srcs[q] = q == r ? at(in, mr.begin, ts) : slot_of(c.bases[q], c.slot_bytes, cur) + (mr.begin - ch.begin) * ts;
    void* dsts[2] = {slot_of(c.bases[r], c.slot_bytes, cur) + (mr.begin - ch.begin) * ts, at(out, mr.begin, ts)};
    if (mr.size() > 0) FASTPAR_CUDA_TRY(reduce(c, dt, op, srcs, n, dsts, 2, mr.size(), n, stream));
    prev = cur;
    if (k + 1 < m) {
      cur = next_round(c);
      FASTPAR_CUDA_TRY(publish(k + 1, cur));
    }
  }
  FASTPAR_CUDA_TRY(phase(c, IpcOp::kAllreduceTwoShot, dt, op, count, stream));
  return copy_out(m - 1, prev);
}

cudaError_t read_status(const IpcComm& c, cudaStream_t stream, uint32_t* status) {
  cuda_p2p::DeviceRestore restore;
  FASTPAR_CUDA_TRY(cudaSetDevice(c.device));
  FASTPAR_CUDA_TRY(cudaMemcpyAsync(status, status_of(c.bases[c.rank]), sizeof(uint32_t), cudaMemcpyDeviceToHost,
                                   stream));
  return cudaStreamSynchronize(stream);
}

}  // namespace cuda_ipc
}  // namespace fastpar
