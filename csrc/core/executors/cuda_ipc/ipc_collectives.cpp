// ipc_collectives.h's entry points: the shared schedules of
// core/algorithms/copy_collectives_slots.h and reduce_slots.h run over IpcSteps
// (ipc_steps.h), which enqueues every step on the caller's stream, or, where
// IpcComm::fused_collectives, the same pieces and phases in one kernel
// (ipc_fused_collectives.h). Host code only: tests/cpp/cuda_host_emulation
// runs them with one thread per rank.
#include "ipc_collectives.h"

#include <algorithm>

#include "../../algorithms/copy_collectives_slots.h"
#include "../../algorithms/reduce_slots.h"
#include "ipc_fused_collectives.h"
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

// The step-by-step schedules' descriptor: `call`, its schedule named, so that
// a peer running the call as one kernel fails the check (and not the wait).
CollCall stepwise(CollCall call) {
  call.aux = kAuxStepCollective;
  return call;
}

// The call as one kernel (ipc_fused_collectives.h), numbered as the
// step-by-step schedule: `a.pieces` pieces of `a.piece` bytes take as many slot
// rounds and phases. The caller fills the kind, root, sizes and buffers.
cudaError_t run_fused(IpcComm& c, CollCall call, DType dt, ReduceOp op, FusedCollArgs a, cudaStream_t stream) {
  return run_schedule(c, stream, [&](IpcSteps& s) {
    const int n = c.size;
    call.aux = kAuxFusedCollective;
    a.pieces = num_pieces(a.bytes, a.piece);
    a.phase = ipc_steps::phase_args(c, call);
    c.seq += uint64_t(a.pieces - 1);  // phases desc.seq .. desc.seq + pieces - 1
    fused_coll_bind(a, c);
    a.first_slot = s.next_round();
    for (int64_t i = 1; i < a.pieces; ++i) s.next_round();
    a.contributions = n;
    a.nblocks = fused_coll_blocks(a.bytes, a.piece, c.fused_bytes_per_block, fused_grid_cap(c));
    a.slice = fused_coll_slice(a.bytes, a.piece, a.nblocks);
    const cudaError_t e = launch_fused_collective(dt, op, a, stream);
    if (e != cudaSuccess) throw EnqueueFailed{e};
  });
}

// Arguments of a fused call of `kind`: pieces of a slot (one region) or of
// a region of it (the region kinds), in whole elements of `es` bytes.
FusedCollArgs fused_args(const IpcComm& c, FusedColl kind, int root, int64_t bytes, int64_t es) {
  FusedCollArgs a{};
  a.kind = kind;
  a.root = root;
  a.bytes = bytes;
  a.stride = fused_coll_regions(kind) ? region_bytes(int64_t(c.slot_bytes), c.size) : int64_t(c.slot_bytes);
  a.piece = std::max<int64_t>(1, a.stride / es) * es;
  return a;
}

}  // namespace

cudaError_t barrier_ipc(IpcComm& c, cudaStream_t stream) {
  return run_schedule(c, stream, [&](IpcSteps& s) { barrier_slots(s, CollCall{Coll::kBarrier, 0, DType::U8}); });
}

cudaError_t broadcast_ipc(IpcComm& c, int32_t dtype, int64_t count, void* data, int64_t bytes, int root,
                          cudaStream_t stream) {
  if (bad_root(c, root) || bytes < 0) return cudaErrorInvalidValue;
  if (c.fused_collectives) {
    FusedCollArgs a = fused_args(c, FusedColl::kBroadcast, root, bytes, 1);
    a.src[0] = a.dst[0] = static_cast<char*>(data);
    return run_fused(c, CollCall{Coll::kBroadcast, count, DType(dtype), root}, DType::U8, ReduceOp::SUM, a, stream);
  }
  return run_schedule(c, stream, [&](IpcSteps& s) {
    broadcast_slots(s, stepwise(CollCall{Coll::kBroadcast, count, DType(dtype), root}), static_cast<char*>(data),
                    bytes, root);
  });
}

cudaError_t allgather_ipc(IpcComm& c, int32_t dtype, int64_t count, const void* in, void* const* outs, int64_t bytes,
                          cudaStream_t stream) {
  if (bytes < 0) return cudaErrorInvalidValue;
  if (c.fused_collectives) {
    FusedCollArgs a = fused_args(c, FusedColl::kGather, -1, bytes, 1);
    a.src[0] = static_cast<const char*>(in);
    for (int q = 0; q < c.size && q < kMaxIpcRanks; ++q) a.dst[q] = static_cast<char*>(outs[q]);
    return run_fused(c, CollCall{Coll::kAllgather, count, DType(dtype)}, DType::U8, ReduceOp::SUM, a, stream);
  }
  return run_schedule(c, stream, [&](IpcSteps& s) {
    gather_slots(s, stepwise(CollCall{Coll::kAllgather, count, DType(dtype)}), static_cast<const char*>(in),
                 Bytes(c, outs).p, bytes, -1);
  });
}

cudaError_t gather_ipc(IpcComm& c, int32_t dtype, int64_t count, const void* in, void* const* outs, int64_t bytes,
                       int root, cudaStream_t stream) {
  if (bad_root(c, root) || bytes < 0) return cudaErrorInvalidValue;
  if (c.fused_collectives) {
    FusedCollArgs a = fused_args(c, FusedColl::kGather, root, bytes, 1);
    a.src[0] = static_cast<const char*>(in);
    if (c.rank == root)
      for (int q = 0; q < c.size && q < kMaxIpcRanks; ++q) a.dst[q] = static_cast<char*>(outs[q]);
    return run_fused(c, CollCall{Coll::kGather, count, DType(dtype), root}, DType::U8, ReduceOp::SUM, a, stream);
  }
  return run_schedule(c, stream, [&](IpcSteps& s) {
    void* none[kMaxIpcRanks] = {};
    gather_slots(s, stepwise(CollCall{Coll::kGather, count, DType(dtype), root}), static_cast<const char*>(in),
                 Bytes(c, c.rank == root ? outs : none).p, bytes, root);
  });
}

cudaError_t scatter_ipc(IpcComm& c, int32_t dtype, int64_t count, const void* const* ins, void* out, int64_t bytes,
                        int root, cudaStream_t stream) {
  if (bad_root(c, root) || bytes < 0) return cudaErrorInvalidValue;
  if (c.fused_collectives) {
    FusedCollArgs a = fused_args(c, FusedColl::kScatter, root, bytes, 1);
    if (c.rank == root)
      for (int q = 0; q < c.size && q < kMaxIpcRanks; ++q) a.src[q] = static_cast<const char*>(ins[q]);
    a.dst[0] = static_cast<char*>(out);
    return run_fused(c, CollCall{Coll::kScatter, count, DType(dtype), root}, DType::U8, ReduceOp::SUM, a, stream);
  }
  return run_schedule(c, stream, [&](IpcSteps& s) {
    const void* none[kMaxIpcRanks] = {};
    scatter_slots(s, stepwise(CollCall{Coll::kScatter, count, DType(dtype), root}),
                  ConstBytes(c, c.rank == root ? ins : none).p, static_cast<char*>(out), bytes, root);
  });
}

cudaError_t all_to_all_ipc(IpcComm& c, int32_t dtype, int64_t count, const void* const* ins, void* const* outs,
                           int64_t bytes, cudaStream_t stream) {
  if (bytes < 0) return cudaErrorInvalidValue;
  if (c.fused_collectives) {
    FusedCollArgs a = fused_args(c, FusedColl::kAllToAll, -1, bytes, 1);
    for (int q = 0; q < c.size && q < kMaxIpcRanks; ++q) {
      a.src[q] = static_cast<const char*>(ins[q]);
      a.dst[q] = static_cast<char*>(outs[q]);
    }
    return run_fused(c, CollCall{Coll::kAlltoall, count, DType(dtype)}, DType::U8, ReduceOp::SUM, a, stream);
  }
  return run_schedule(c, stream, [&](IpcSteps& s) {
    alltoall_blocks(s, stepwise(CollCall{Coll::kAlltoall, count, DType(dtype)}), ConstBytes(c, ins).p,
                    Bytes(c, outs).p, bytes);
  });
}

cudaError_t reduce_ipc(IpcComm& c, DType dt, ReduceOp op, const void* in, void* out, int64_t count, int root,
                       cudaStream_t stream) {
  if (bad_root(c, root) || count < 0) return cudaErrorInvalidValue;
  if (c.fused_collectives) {
    const int64_t es = dtype_size(dt);
    FusedCollArgs a = fused_args(c, FusedColl::kReduce, root, count * es, es);
    a.src[0] = static_cast<const char*>(in);
    a.dst[0] = static_cast<char*>(out);
    return run_fused(c, CollCall{Coll::kReduce, count, dt, root, int(op)}, dt, op, a, stream);
  }
  return run_schedule(c, stream, [&](IpcSteps& s) {
    reduce_slots(s, stepwise(CollCall{Coll::kReduce, count, dt, root, int(op)}), static_cast<const char*>(in),
                 static_cast<char*>(out), count, dtype_size(dt), root, s.reducer(dt, op));
  });
}

cudaError_t reduce_scatter_ipc(IpcComm& c, DType dt, ReduceOp op, const void* const* ins, void* out, int64_t count,
                               cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (c.fused_collectives) {
    const int64_t es = dtype_size(dt);
    FusedCollArgs a = fused_args(c, FusedColl::kReduceScatter, -1, count * es, es);
    for (int q = 0; q < c.size && q < kMaxIpcRanks; ++q) a.src[q] = static_cast<const char*>(ins[q]);
    a.dst[0] = static_cast<char*>(out);
    return run_fused(c, CollCall{Coll::kReduceScatter, count, dt, -1, int(op)}, dt, op, a, stream);
  }
  return run_schedule(c, stream, [&](IpcSteps& s) {
    reduce_scatter_blocks(s, stepwise(CollCall{Coll::kReduceScatter, count, dt, -1, int(op)}), ConstBytes(c, ins).p,
                          static_cast<char*>(out), count, dtype_size(dt), s.reducer(dt, op));
  });
}

}  // namespace cuda_ipc
}  // namespace fastpar
