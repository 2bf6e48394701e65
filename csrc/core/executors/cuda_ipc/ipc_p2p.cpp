// Host schedules of ipc_p2p.h. Host code only: the host emulation runs them.
#include "ipc_p2p.h"

#include <algorithm>

#include "../../algorithms/slot_transport.h"  // num_pieces, piece_len
#include "../../transport/cuda_p2p/cuda_try.h"
#include "ipc_steps.h"
#include "p2p_ring.h"

namespace fastpar {
namespace cuda_ipc {
namespace {

P2PArgs args_for(IpcComm& c, P2PStep step, int other, uint64_t seq, int64_t tag, int64_t total, int64_t offset) {
  P2PArgs a{};
  a.step = step;
  a.self = p2p_control_of(c.bases[c.rank], c.slot_bytes);
  a.peer = p2p_control_of(c.bases[other], c.slot_bytes);
  a.self_cb = control_of(c.bases[c.rank]);
  for (int q = 0; q < c.size; ++q) a.peers_cb[q] = control_of(c.bases[q]);
  a.status = status_of(c.bases[c.rank]);
  a.host_status = c.host_status;
  a.host_abort = c.host_abort;
  a.rank = c.rank;
  a.other = other;
  a.size = c.size;
  a.seq = seq;
  a.tag = tag;
  a.total = total;
  a.offset = offset;
  a.timeout_ns = c.timeout_ns;
  return a;
}

cudaError_t check_peer(const IpcComm& c, int peer, int64_t bytes) {
  FASTPAR_CUDA_TRY(ipc_steps::check_comm(c));
  if (peer < 0 || peer >= c.size || peer == c.rank || bytes < 0) return cudaErrorInvalidValue;
  return cudaSuccess;
}

}  // namespace

int64_t p2p_chunks(int64_t bytes) { return num_pieces(bytes, int64_t(kP2PChunkBytes)); }

cudaError_t send_ipc(IpcComm& c, const void* data, int64_t bytes, int dst, int64_t tag, cudaStream_t stream) {
  FASTPAR_CUDA_TRY(check_peer(c, dst, bytes));
  const cuda_p2p::ScopedDevice on_device(c.device);
  FASTPAR_CUDA_TRY(on_device.error());
  ipc_steps::clear_stale_error();
  const int64_t chunk = int64_t(kP2PChunkBytes);
  for (int64_t i = 0, n = p2p_chunks(bytes); i < n; ++i) {
    const int64_t off = i * chunk, len = piece_len(i, chunk, bytes);
    const uint64_t seq = ++c.p2p_sent[dst];
    cudaError_t e = launch_p2p_step(args_for(c, P2PStep::kCredit, dst, seq, tag, bytes, off), stream);
    // Guarded, not cudaMemcpyAsync: after a failed credit wait the ring slot
    // may still be in the receiver's hands, and must not be overwritten.
    if (e == cudaSuccess)
      e = ipc_steps::guarded_copy(c, p2p_chunk_of(c.bases[c.rank], c.slot_bytes, dst, seq),
                                  static_cast<const char*>(data) + off, len, stream);
    if (e == cudaSuccess) e = launch_p2p_step(args_for(c, P2PStep::kPost, dst, seq, tag, bytes, off), stream);
    // Chunk seq is counted and earlier ones may be posted: out of step.
    if (e != cudaSuccess) return ipc_steps::fail_enqueue(c, e, stream);
  }
  return cudaSuccess;
}

cudaError_t recv_ipc(IpcComm& c, void* data, int64_t bytes, int src, int64_t tag, cudaStream_t stream) {
  FASTPAR_CUDA_TRY(check_peer(c, src, bytes));
  const cuda_p2p::ScopedDevice on_device(c.device);
  FASTPAR_CUDA_TRY(on_device.error());
  ipc_steps::clear_stale_error();
  const int64_t chunk = int64_t(kP2PChunkBytes);
  for (int64_t i = 0, n = p2p_chunks(bytes); i < n; ++i) {
    const int64_t off = i * chunk, len = piece_len(i, chunk, bytes);
    const uint64_t seq = ++c.p2p_received[src];
    cudaError_t e = launch_p2p_step(args_for(c, P2PStep::kWait, src, seq, tag, bytes, off), stream);
    if (e == cudaSuccess)
      e = ipc_steps::guarded_copy(c, static_cast<char*>(data) + off,
                                  p2p_chunk_of(c.bases[src], c.slot_bytes, c.rank, seq), len, stream);
    if (e == cudaSuccess) e = launch_p2p_step(args_for(c, P2PStep::kConsume, src, seq, tag, bytes, off), stream);
    if (e != cudaSuccess) return ipc_steps::fail_enqueue(c, e, stream);
  }
  return cudaSuccess;
}

}  // namespace cuda_ipc
}  // namespace fastpar
