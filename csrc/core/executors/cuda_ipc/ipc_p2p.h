// send / recv of bytes between two ranks of an IpcComm over the p2p rings of
// p2p_ring.h (protocol, matching and failure rules there). Host schedules:
// they enqueue kernels and copies on `stream` and never block the host;
// tests/cpp/cuda_host_emulation/ipc_p2p_test.cpp runs them with one thread
// per rank.
//
// Stream rule: all sends from this rank to one destination must execute in
// the order they are enqueued, and so must all receives from one source (the
// c10d backend gives each peer and direction one stream of its own). A send
// and a receive between the same two ranks must not share a stream that
// serializes them the wrong way round: a send of more than kP2PChunks chunks
// waits (on the device) for the receiver to drain the ring.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ipc_allreduce.h"

namespace fastpar {
namespace cuda_ipc {

// Enqueues the message `data[0, bytes)` with `tag` to rank `dst` (!= rank).
cudaError_t send_ipc(IpcComm& c, const void* data, int64_t bytes, int dst, int64_t tag, cudaStream_t stream);

// Enqueues the receive of the next message from rank `src` (!= rank) into
// `data[0, bytes)`; the message must have `tag` and exactly `bytes` bytes,
// else this rank's status word records kMismatch and `data` is not written
// past the chunks that matched.
cudaError_t recv_ipc(IpcComm& c, void* data, int64_t bytes, int src, int64_t tag, cudaStream_t stream);

// Chunks a message of `bytes` takes (one for an empty message).
int64_t p2p_chunks(int64_t bytes);

}  // namespace cuda_ipc
}  // namespace fastpar
