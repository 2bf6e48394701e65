// Host schedules of collectives_ipc.h (see there). Host code only:
// tests/cpp/cuda_host_emulation runs them with one thread per rank.
#include "collectives_ipc.h"

#include <algorithm>

#include "../cuda_p2p/cuda_try.h"
#include "ipc_steps.h"

namespace fastpar {
namespace cuda_ipc {
namespace {

int64_t pieces(int64_t bytes, int64_t piece) { return std::max<int64_t>(1, (bytes + piece - 1) / piece); }

// Length of piece i of `total` cut in pieces of `piece` (0 past the end:
// every call runs at least one phase, even when there is nothing to move).
int64_t piece_len(int64_t i, int64_t piece, int64_t total) {
  return std::max<int64_t>(0, std::min(piece, total - i * piece));
}

// 16-byte multiples keep every region of a slot aligned for the vector path.
int64_t region_bytes(const IpcComm& c) { return std::max<int64_t>(16, int64_t(c.slot_bytes) / c.size / 16 * 16); }

char* slot(IpcComm& c, int q, int k) { return slot_of(c.bases[q], c.slot_bytes, k); }

}  // namespace

using ipc_steps::at;
using ipc_steps::check_comm;
using ipc_steps::guarded_copy;
using ipc_steps::next_round;

cudaError_t broadcast_ipc(IpcComm& c, int32_t dtype, int64_t count, void* data, int64_t bytes, int root,
                          cudaStream_t stream) {
  FASTPAR_CUDA_TRY(check_comm(c));
  if (root < 0 || root >= c.size || bytes < 0) return cudaErrorInvalidValue;
  const int r = c.rank;
  const int64_t B = int64_t(c.slot_bytes);
  cuda_p2p::DeviceRestore restore;
  FASTPAR_CUDA_TRY(cudaSetDevice(c.device));
  for (int64_t i = 0, np = pieces(bytes, B); i < np; ++i) {
    const int64_t off = i * B, len = piece_len(i, B, bytes);
    const int k = next_round(c);
    if (r == root && len > 0)
      FASTPAR_CUDA_TRY(cudaMemcpyAsync(slot(c, r, k), at(data, off, 1), size_t(len), cudaMemcpyDeviceToDevice, stream));
    FASTPAR_CUDA_TRY(ipc_steps::phase(c, IpcOp::kBroadcast, dtype, -1, count, root, stream));
    if (r != root) FASTPAR_CUDA_TRY(guarded_copy(c, at(data, off, 1), slot(c, root, k), len, stream));
  }
  return cudaSuccess;
}

cudaError_t allgather_ipc(IpcComm& c, int32_t dtype, int64_t count, const void* in, void* const* outs, int64_t bytes,
                          cudaStream_t stream) {
  FASTPAR_CUDA_TRY(check_comm(c));
  if (bytes < 0) return cudaErrorInvalidValue;
  const int n = c.size, r = c.rank;
  const int64_t B = int64_t(c.slot_bytes);
  cuda_p2p::DeviceRestore restore;
  FASTPAR_CUDA_TRY(cudaSetDevice(c.device));
  for (int64_t i = 0, np = pieces(bytes, B); i < np; ++i) {
    const int64_t off = i * B, len = piece_len(i, B, bytes);
    const int k = next_round(c);
    if (len > 0)
      FASTPAR_CUDA_TRY(cudaMemcpyAsync(slot(c, r, k), at(in, off, 1), size_t(len), cudaMemcpyDeviceToDevice, stream));
    FASTPAR_CUDA_TRY(ipc_steps::phase(c, IpcOp::kAllgather, dtype, -1, count, -1, stream));
    for (int q = 0; q < n; ++q) {
      // Our own block from our input, not the slot: the input may alias outs[r].
      FASTPAR_CUDA_TRY(guarded_copy(c, at(outs[q], off, 1), q == r ? at(in, off, 1) : slot(c, q, k), len, stream));
    }
  }
  return cudaSuccess;
}

cudaError_t gather_ipc(IpcComm& c, int32_t dtype, int64_t count, const void* in, void* const* outs, int64_t bytes,
                       int root, cudaStream_t stream) {
  FASTPAR_CUDA_TRY(check_comm(c));
  if (root < 0 || root >= c.size || bytes < 0) return cudaErrorInvalidValue;
  const int n = c.size, r = c.rank;
  const int64_t B = int64_t(c.slot_bytes);
  cuda_p2p::DeviceRestore restore;
  FASTPAR_CUDA_TRY(cudaSetDevice(c.device));
  for (int64_t i = 0, np = pieces(bytes, B); i < np; ++i) {
    const int64_t off = i * B, len = piece_len(i, B, bytes);
    const int k = next_round(c);
    if (r != root && len > 0)
      FASTPAR_CUDA_TRY(cudaMemcpyAsync(slot(c, r, k), at(in, off, 1), size_t(len), cudaMemcpyDeviceToDevice, stream));
    FASTPAR_CUDA_TRY(ipc_steps::phase(c, IpcOp::kGather, dtype, -1, count, root, stream));
    if (r != root) continue;
    for (int q = 0; q < n; ++q)
      FASTPAR_CUDA_TRY(guarded_copy(c, at(outs[q], off, 1), q == r ? at(in, off, 1) : slot(c, q, k), len, stream));
  }
  return cudaSuccess;
}

cudaError_t scatter_ipc(IpcComm& c, int32_t dtype, int64_t count, const void* const* ins, void* out, int64_t bytes,
                        int root, cudaStream_t stream) {
  FASTPAR_CUDA_TRY(check_comm(c));
  if (root < 0 || root >= c.size || bytes < 0) return cudaErrorInvalidValue;
  const int n = c.size, r = c.rank;
  const int64_t region = region_bytes(c);
  if (region * n > int64_t(c.slot_bytes)) return cudaErrorInvalidValue;
  cuda_p2p::DeviceRestore restore;
  FASTPAR_CUDA_TRY(cudaSetDevice(c.device));
  for (int64_t i = 0, np = pieces(bytes, region); i < np; ++i) {
    const int64_t off = i * region, len = piece_len(i, region, bytes);
    const int k = next_round(c);
    if (r == root && len > 0)
      for (int q = 0; q < n; ++q)
        if (q != r)
          FASTPAR_CUDA_TRY(cudaMemcpyAsync(slot(c, r, k) + q * region, at(ins[q], off, 1), size_t(len),
                                           cudaMemcpyDeviceToDevice, stream));
    FASTPAR_CUDA_TRY(ipc_steps::phase(c, IpcOp::kScatter, dtype, -1, count, root, stream));
    FASTPAR_CUDA_TRY(guarded_copy(c, at(out, off, 1), r == root ? at(ins[r], off, 1) : slot(c, root, k) + r * region,
                                  len, stream));
  }
  return cudaSuccess;
}

cudaError_t all_to_all_ipc(IpcComm& c, int32_t dtype, int64_t count, const void* const* ins, void* const* outs,
                           int64_t bytes, cudaStream_t stream) {
  FASTPAR_CUDA_TRY(check_comm(c));
  if (bytes < 0) return cudaErrorInvalidValue;
  const int n = c.size, r = c.rank;
  const int64_t region = region_bytes(c);
  if (region * n > int64_t(c.slot_bytes)) return cudaErrorInvalidValue;
  cuda_p2p::DeviceRestore restore;
  FASTPAR_CUDA_TRY(cudaSetDevice(c.device));
  for (int64_t i = 0, np = pieces(bytes, region); i < np; ++i) {
    const int64_t off = i * region, len = piece_len(i, region, bytes);
    const int k = next_round(c);
    for (int q = 0; q < n && len > 0; ++q) {
      if (q == r) continue;
      FASTPAR_CUDA_TRY(cudaMemcpyAsync(slot(c, r, k) + q * region, at(ins[q], off, 1), size_t(len),
                                       cudaMemcpyDeviceToDevice, stream));
    }
    FASTPAR_CUDA_TRY(guarded_copy(c, at(outs[r], off, 1), at(ins[r], off, 1), len, stream));
    FASTPAR_CUDA_TRY(ipc_steps::phase(c, IpcOp::kAllToAll, dtype, -1, count, -1, stream));
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      FASTPAR_CUDA_TRY(guarded_copy(c, at(outs[q], off, 1), slot(c, q, k) + r * region, len, stream));
    }
  }
  return cudaSuccess;
}

cudaError_t reduce_ipc(IpcComm& c, DType dt, ReduceOp op, const void* in, void* out, int64_t count, int root,
                       cudaStream_t stream) {
  FASTPAR_CUDA_TRY(check_comm(c));
  if (root < 0 || root >= c.size || count < 0) return cudaErrorInvalidValue;
  const int n = c.size, r = c.rank;
  const int64_t ts = dtype_size(dt);
  const int64_t chunk = std::max<int64_t>(1, int64_t(c.slot_bytes) / ts);
  cuda_p2p::DeviceRestore restore;
  FASTPAR_CUDA_TRY(cudaSetDevice(c.device));
  for (int64_t i = 0, np = pieces(count, chunk); i < np; ++i) {
    const int64_t cb = i * chunk, len = piece_len(i, chunk, count);
    const int k = next_round(c);
    if (r != root && len > 0)
      FASTPAR_CUDA_TRY(cudaMemcpyAsync(slot(c, r, k), at(in, cb, ts), size_t(len * ts), cudaMemcpyDeviceToDevice,
                                       stream));
    FASTPAR_CUDA_TRY(ipc_steps::phase(c, IpcOp::kReduce, int32_t(dt), int32_t(op), count, root, stream));
    if (r != root || len == 0) continue;
    const void* srcs[kMaxIpcRanks];
    for (int q = 0; q < n; ++q) srcs[q] = q == r ? static_cast<const void*>(at(in, cb, ts)) : slot(c, q, k);
    void* dst[1] = {at(out, cb, ts)};
    FASTPAR_CUDA_TRY(ipc_steps::reduce(c, dt, op, srcs, n, dst, 1, len, n, stream));
  }
  return cudaSuccess;
}

cudaError_t reduce_scatter_ipc(IpcComm& c, DType dt, ReduceOp op, const void* const* ins, void* out, int64_t count,
                               cudaStream_t stream) {
  FASTPAR_CUDA_TRY(check_comm(c));
  if (count < 0) return cudaErrorInvalidValue;
  const int n = c.size, r = c.rank;
  const int64_t ts = dtype_size(dt);
  const int64_t region = region_bytes(c);
  if (region * n > int64_t(c.slot_bytes)) return cudaErrorInvalidValue;  // slots under 16 bytes per rank
  const int64_t chunk = std::max<int64_t>(1, region / ts);
  cuda_p2p::DeviceRestore restore;
  FASTPAR_CUDA_TRY(cudaSetDevice(c.device));
  for (int64_t i = 0, np = pieces(count, chunk); i < np; ++i) {
    const int64_t cb = i * chunk, len = piece_len(i, chunk, count);
    const int k = next_round(c);
    for (int q = 0; q < n; ++q) {
      if (q == r || len == 0) continue;
      FASTPAR_CUDA_TRY(cudaMemcpyAsync(slot(c, r, k) + q * region, at(ins[q], cb, ts), size_t(len * ts),
                                       cudaMemcpyDeviceToDevice, stream));
    }
    FASTPAR_CUDA_TRY(ipc_steps::phase(c, IpcOp::kReduceScatter, int32_t(dt), int32_t(op), count, -1, stream));
    if (len == 0) continue;
    const void* srcs[kMaxIpcRanks];
    for (int q = 0; q < n; ++q)
      srcs[q] = q == r ? static_cast<const void*>(at(ins[r], cb, ts)) : slot(c, q, k) + r * region;
    void* dst[1] = {at(out, cb, ts)};
    FASTPAR_CUDA_TRY(ipc_steps::reduce(c, dt, op, srcs, n, dst, 1, len, n, stream));
  }
  return cudaSuccess;
}

}  // namespace cuda_ipc
}  // namespace fastpar
