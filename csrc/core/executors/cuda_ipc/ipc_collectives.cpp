// ipc_collectives.h's entry points: the shared schedules of
// core/algorithms/copy_collectives_slots.h and reduce_slots.h run over IpcSteps
// (ipc_steps.h), which enqueues every step on the caller's stream. Host code
// only: tests/cpp/cuda_host_emulation runs them with one thread per rank.
#include "ipc_collectives.h"

#include "../../algorithms/copy_collectives_slots.h"
#include "../../algorithms/reduce_slots.h"
#include "ipc_steps.h"

namespace fastpar {
namespace cuda_ipc {
namespace {

bool bad_root(const IpcComm& c, int root) { return root < 0 || root >= c.size; }

// The schedules take byte pointers; these views are arrays of c.size of them.
struct Bytes {
  char* p[kMaxIpcRanks] = {};
  Bytes(const IpcComm& c, void* const* v) {
    for (int q = 0; q < c.size && q < kMaxIpcRanks; ++q) p[q] = static_cast<char*>(v[q]);
  }
};
struct ConstBytes {
  const char* p[kMaxIpcRanks] = {};
  ConstBytes(const IpcComm& c, const void* const* v) {
    for (int q = 0; q < c.size && q < kMaxIpcRanks; ++q) p[q] = static_cast<const char*>(v[q]);
  }
};

}  // namespace

cudaError_t barrier_ipc(IpcComm& c, cudaStream_t stream) {
  return run_schedule(c, stream, [&](IpcSteps& s) { barrier_slots(s, CollCall{Coll::kBarrier, 0, DType::U8}); });
}

cudaError_t broadcast_ipc(IpcComm& c, int32_t dtype, int64_t count, void* data, int64_t bytes, int root,
                          cudaStream_t stream) {
  if (bad_root(c, root) || bytes < 0) return cudaErrorInvalidValue;
  return run_schedule(c, stream, [&](IpcSteps& s) {
    broadcast_slots(s, CollCall{Coll::kBroadcast, count, DType(dtype), root}, static_cast<char*>(data), bytes, root);
  });
}

cudaError_t allgather_ipc(IpcComm& c, int32_t dtype, int64_t count, const void* in, void* const* outs, int64_t bytes,
                          cudaStream_t stream) {
  if (bytes < 0) return cudaErrorInvalidValue;
  return run_schedule(c, stream, [&](IpcSteps& s) {
    gather_slots(s, CollCall{Coll::kAllgather, count, DType(dtype)}, static_cast<const char*>(in), Bytes(c, outs).p,
                 bytes, -1);
  });
}

cudaError_t gather_ipc(IpcComm& c, int32_t dtype, int64_t count, const void* in, void* const* outs, int64_t bytes,
                       int root, cudaStream_t stream) {
  if (bad_root(c, root) || bytes < 0) return cudaErrorInvalidValue;
  return run_schedule(c, stream, [&](IpcSteps& s) {
    void* none[kMaxIpcRanks] = {};
    gather_slots(s, CollCall{Coll::kGather, count, DType(dtype), root}, static_cast<const char*>(in),
                 Bytes(c, c.rank == root ? outs : none).p, bytes, root);
  });
}

cudaError_t scatter_ipc(IpcComm& c, int32_t dtype, int64_t count, const void* const* ins, void* out, int64_t bytes,
                        int root, cudaStream_t stream) {
  if (bad_root(c, root) || bytes < 0) return cudaErrorInvalidValue;
  return run_schedule(c, stream, [&](IpcSteps& s) {
    const void* none[kMaxIpcRanks] = {};
    scatter_slots(s, CollCall{Coll::kScatter, count, DType(dtype), root}, ConstBytes(c, c.rank == root ? ins : none).p,
                  static_cast<char*>(out), bytes, root);
  });
}

cudaError_t all_to_all_ipc(IpcComm& c, int32_t dtype, int64_t count, const void* const* ins, void* const* outs,
                           int64_t bytes, cudaStream_t stream) {
  if (bytes < 0) return cudaErrorInvalidValue;
  return run_schedule(c, stream, [&](IpcSteps& s) {
    alltoall_blocks(s, CollCall{Coll::kAlltoall, count, DType(dtype)}, ConstBytes(c, ins).p, Bytes(c, outs).p, bytes);
  });
}

cudaError_t reduce_ipc(IpcComm& c, DType dt, ReduceOp op, const void* in, void* out, int64_t count, int root,
                       cudaStream_t stream) {
  if (bad_root(c, root) || count < 0) return cudaErrorInvalidValue;
  return run_schedule(c, stream, [&](IpcSteps& s) {
    reduce_slots(s, CollCall{Coll::kReduce, count, dt, root, int(op)}, static_cast<const char*>(in),
                 static_cast<char*>(out), count, dtype_size(dt), root, s.reducer(dt, op));
  });
}

cudaError_t reduce_scatter_ipc(IpcComm& c, DType dt, ReduceOp op, const void* const* ins, void* out, int64_t count,
                               cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  return run_schedule(c, stream, [&](IpcSteps& s) {
    reduce_scatter_blocks(s, CollCall{Coll::kReduceScatter, count, dt, -1, int(op)}, ConstBytes(c, ins).p,
                          static_cast<char*>(out), count, dtype_size(dt), s.reducer(dt, op));
  });
}

}  // namespace cuda_ipc
}  // namespace fastpar
