// broadcast, all_gather, gather, scatter, all_to_all (equal blocks), reduce,
// and reduce_scatter across processes through IPC-mapped arenas: the
// CPU shared-memory transport's own schedules (algorithms/
// copy_collectives_slots.h, reduce_slots.h) run over IpcSteps (ipc_steps.h),
// with the same slot rotation, one phase per slot-sized piece, the same
// descriptors (CollCall) and checks. The steps are enqueued on one stream:
//   publish   cudaMemcpyAsync from the caller's tensor into this rank's slot
//   phase     the one-thread phase kernel (post our flag, wait for every peer's)
//   read      the status-guarded copy/reduce kernel reading peers' slots
// Like ipc_allreduce.h, nothing blocks the host; a failed phase is recorded in
// the status word and the later kernels of the call do nothing. Every call
// runs at least one phase, so even a zero-size call meets its peers and has
// its descriptor (op, count, dtype, root, redop) checked. `dtype` of the copy
// collectives is the descriptor's: a DType, or kForeignDType + a torch dtype
// code for dtypes fastpar has no element math for.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ipc_allreduce.h"

namespace fastpar {
namespace cuda_ipc {

// Every rank reaches this call before any leaves it: one phase (the
// barrier's descriptor, so a peer in another collective fails the call).
cudaError_t barrier_ipc(IpcComm& c, cudaStream_t stream);

// `bytes` of `data` from `root` to every rank (in place). Per piece of a slot:
// the root copies it in, one phase, every other rank copies it out.
// `dtype`/`count` only go into the descriptor.
cudaError_t broadcast_ipc(IpcComm& c, int32_t dtype, int64_t count, void* data, int64_t bytes, int root,
                          cudaStream_t stream);

// outs[q][0, bytes) = rank q's `in` on every rank (all_gather;
// all_gather_into_tensor passes outs[q] = out + q * bytes). Per piece: each
// rank copies its own in, one phase, each copies the n-1 peers' out.
cudaError_t allgather_ipc(IpcComm& c, int32_t dtype, int64_t count, const void* in, void* const* outs, int64_t bytes,
                          cudaStream_t stream);

// outs[q][0, bytes) = rank q's `in`, on `root` only (`outs` is read only on
// the root). Per piece: every non-root copies its piece in, one phase, the
// root copies the n-1 pieces out.
cudaError_t gather_ipc(IpcComm& c, int32_t dtype, int64_t count, const void* in, void* const* outs, int64_t bytes,
                       int root, cudaStream_t stream);

// Rank q's out[0, bytes) = the root's ins[q] (`ins` is read only on the root).
// A slot holds n regions, one per destination: per piece the root copies the
// n-1 pieces in, one phase, every non-root copies its region out.
cudaError_t scatter_ipc(IpcComm& c, int32_t dtype, int64_t count, const void* const* ins, void* out, int64_t bytes,
                        int root, cudaStream_t stream);

// All-to-all with equal blocks: rank r's ins[q] (bytes) lands in rank q's
// outs[r]. A slot holds n regions, one per destination: per piece each rank
// copies its n-1 outgoing pieces in and its own block straight across, one
// phase, each copies its n-1 incoming pieces out. `ins` may alias `outs`
// block for block (a piece is published before the phase that lets peers
// overwrite it). Uneven splits are not served here (their sizes would have
// to reach the host before the pieces are counted): the backend sends them
// over the point-to-point rings (ipc_p2p.h).
cudaError_t all_to_all_ipc(IpcComm& c, int32_t dtype, int64_t count, const void* const* ins, void* const* outs,
                           int64_t bytes, cudaStream_t stream);

// out = op over every rank's `in` (count elements), written only on `root`
// (`out` may be `in`; other ranks' buffers are read, never written). Per piece:
// every non-root copies its piece in, one phase, the root reduces the n
// sources in rank order (the same summation order as allreduce: identical bits).
cudaError_t reduce_ipc(IpcComm& c, DType dt, ReduceOp op, const void* in, void* out, int64_t count, int root,
                       cudaStream_t stream);

// Rank r's out (count elements) = op over every rank's ins[r] (ins[q] is the
// q-th block of count elements of the caller's input: reduce_scatter passes
// the list, reduce_scatter_tensor one tensor cut in n). A slot holds n
// regions, one per destination: per piece each rank publishes the n-1 blocks
// meant for its peers, one phase, each reduces its own block from every slot.
cudaError_t reduce_scatter_ipc(IpcComm& c, DType dt, ReduceOp op, const void* const* ins, void* out, int64_t count,
                               cudaStream_t stream);

}  // namespace cuda_ipc
}  // namespace fastpar
