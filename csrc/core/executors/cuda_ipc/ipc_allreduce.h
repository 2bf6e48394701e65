// Allreduce across processes, one GPU each (or sharing one), through
// IPC-mapped arenas (ipc_arena.h). The one-shot and two-shot schedules are the
// CPU shared-memory transport's own (core/algorithms/allreduce_slots.h, run over
// IpcSteps: ipc_steps.h), the flag protocol is the same header
// (core/transport/flag_protocol.h) over DeviceMemory, and the descriptors are the
// same CollCall: every step is enqueued on one CUDA stream.
//
// Nothing here blocks the host. A failed wait (timeout, peer abort, a peer in
// a different call) is recorded in the arena's status word; later kernels of
// this transport then do nothing, and the host learns of it from read_status.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "../../kernels/reduce_ops.h"
#include "../../transport/cuda_ipc/ipc_comm.h"

namespace fastpar {
namespace cuda_ipc {

// The largest message the "auto" schedule runs one-shot among `ranks` ranks.
// One-shot's latency is one phase, two-shot's two; one-shot reads the n-1
// peers' data, two-shot 2(n-1)/n of it: with 2 ranks the same bytes, with
// more, latency decides up to a few hundred KiB (vLLM's custom allreduce:
// 512 KiB for up to 4 GPUs, 256 KiB for 8). Yet the one-kernel one-shot has
// at most kFusedMaxBlocks blocks, so from a few MiB its bandwidth falls
// behind two-shot's (docs/measurements.md has the H100's figures).
inline int64_t default_one_shot_max_bytes(int ranks) {
  return ranks <= 2 ? 2 * 1024 * 1024 : ranks <= 4 ? 512 * 1024 : 256 * 1024;
}

// The "auto" schedule: one-shot for messages that fit one slot, up to
// `max_bytes` (< 0: default_one_shot_max_bytes). Depends only on what every
// rank has alike (the size, the group, the setting), so every rank picks the
// same; a rank that picked otherwise would fail the descriptor check.
inline bool prefer_one_shot(int64_t nbytes, const IpcComm& c, int64_t max_bytes = -1) {
  if (max_bytes < 0) max_bytes = default_one_shot_max_bytes(c.size);
  return nbytes <= max_bytes && nbytes <= int64_t(c.slot_bytes);
}


// One-shot: each chunk (a slot's worth) is copied in, one phase, and every rank
// reduces all n slots. Latency: one flag round trip per chunk. `out` may be `in`.
cudaError_t allreduce_one_shot(IpcComm& c, DType dt, ReduceOp op, const void* in, void* out, int64_t count,
                               cudaStream_t stream);

// Two-shot, pipelined over chunks: rank r publishes the shards q != r, reduces
// shard r from every rank into its slot and `out`, and copies the other final
// shards from their owners one phase later, overlapped with the next chunk (m
// chunks, m + 1 phases). Each rank reads 2(n-1)/n of the data instead of n-1
// times it. `out` may be `in`.
cudaError_t allreduce_two_shot(IpcComm& c, DType dt, ReduceOp op, const void* in, void* out, int64_t count,
                               cudaStream_t stream);

// The all_reduce that CUDA graph capture can record and replay (ipc_graph.h):
// no host counter in its arguments, the arena's graph slots and flags. It
// runs the schedule and grid of the eager call of its size: the fused
// one-shot where prefer_one_shot(bytes, c, one_shot_max_bytes) holds, else
// the fused two-shot (whichever form the eager two-shot takes: the
// step-by-step one cannot be replayed). count * the dtype's size must fit one
// slot (else cudaErrorInvalidValue, nothing enqueued). Every rank must run
// the same sequence of graphed calls. `out` may be `in`.
cudaError_t allreduce_graphed(IpcComm& c, DType dt, ReduceOp op, const void* in, void* out, int64_t count,
                              cudaStream_t stream, int64_t one_shot_max_bytes = -1);

// The two-shot on a registered buffer: `count` elements at `offset` of every
// rank's registered region (registered_of), reduced in place with no copy-in
// (allreduce_slots.h, allreduce_registered: m slot-sized chunks take m + 2
// phases; the last keeps a peer from reading the buffer after the call).
// Every rank passes the same offset (the descriptor checks it).
cudaError_t allreduce_registered(IpcComm& c, DType dt, ReduceOp op, int64_t offset, int64_t count,
                                 cudaStream_t stream);

// registered_empty's agreement (allreduce_slots.h, agree_registered): one
// phase comparing `bytes` and `offset` (< 0: this rank had no room).
cudaError_t agree_registered_ipc(IpcComm& c, int64_t bytes, int64_t offset, cudaStream_t stream);

// Copies the status word to the host (synchronizes `stream`): 0, or the
// flags::WaitStatus of the first failed phase.
cudaError_t read_status(const IpcComm& c, cudaStream_t stream, uint32_t* status);

}  // namespace cuda_ipc
}  // namespace fastpar
