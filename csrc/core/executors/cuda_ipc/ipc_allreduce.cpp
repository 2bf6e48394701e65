// ipc_allreduce.h's entry points. The one-shot and two-shot schedules are the
// shared ones of core/algorithms/allreduce_slots.h run over IpcSteps (ipc_steps.h);
// the fused one-shot and the graphed call are single kernels of their own
// (ipc_fused_one_shot.h). Host code only: tests/cpp/cuda_host_emulation runs these
// with one thread per rank.
#include "ipc_allreduce.h"

#include <algorithm>

#include "../../algorithms/allreduce_slots.h"
#include "ipc_fused_collectives.h"
#include "ipc_fused_one_shot.h"
#include "ipc_fused_two_shot.h"
#include "ipc_steps.h"

namespace fastpar {
namespace cuda_ipc {

cudaError_t allreduce_one_shot(IpcComm& c, DType dt, ReduceOp op, const void* in, void* out, int64_t count,
                               cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  const int64_t es = dtype_size(dt);
  if (c.fused_one_shot && count > 0 && count * es <= int64_t(c.slot_bytes)) {
    // One launch instead of three (ipc_fused_one_shot.h).
    return run_schedule(c, stream, [&](IpcSteps& s) {
      const int n = c.size, k = s.next_round();
      FusedArgs a{};
      a.phase = ipc_steps::phase_args(c, CollCall{Coll::kAllreduce, count, dt, -1, int(op), kAuxFused});
      a.self_blocks = block_flags_of(c.bases[c.rank]);
      for (int q = 0; q < n; ++q) {
        a.peer_blocks[q] = block_flags_of(c.bases[q]);
        a.slots[q] = s.slot(q, k);
      }
      a.in = in;
      a.out = out;
      a.count = count;
      a.contributions = n;
      a.nblocks = fused_one_shot_blocks(count * es, c.fused_bytes_per_block, fused_grid_cap(c));
      const cudaError_t e = launch_fused_one_shot(dt, op, a, stream);
      if (e != cudaSuccess) throw EnqueueFailed{e};
    });
  }
  return run_schedule(c, stream, [&](IpcSteps& s) {
    fastpar::allreduce_one_shot(s, CollCall{Coll::kAllreduce, count, dt, -1, int(op), kAuxOneShot},
                                static_cast<const char*>(in), static_cast<char*>(out), count, es, s.reducer(dt, op));
  });
}

cudaError_t allreduce_two_shot(IpcComm& c, DType dt, ReduceOp op, const void* in, void* out, int64_t count,
                               cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (c.fused_two_shot) {
    // One launch for the whole call (ipc_fused_two_shot.h), numbered as the
    // step-by-step schedule: m chunks take m slot rounds and m + 1 phases.
    return run_schedule(c, stream, [&](IpcSteps& s) {
      const int n = c.size;
      const int64_t es = dtype_size(dt);
      const int64_t chunk = std::max<int64_t>(1, int64_t(c.slot_bytes) / es);
      const int64_t m = std::max<int64_t>(1, (count + chunk - 1) / chunk);
      TwoShotArgs a{};
      a.phase = ipc_steps::phase_args(c, CollCall{Coll::kAllreduce, count, dt, -1, int(op), kAuxFusedTwoShot});
      c.seq += uint64_t(m);  // phases desc.seq .. desc.seq + m
      a.self_blocks = block_flags_of(c.bases[c.rank]);
      for (int q = 0; q < n; ++q) {
        a.peer_blocks[q] = block_flags_of(c.bases[q]);
        a.slot0[q] = slot_of(c.bases[q], c.slot_bytes, 0);
      }
      a.slot_stride = int64_t(slot_stride(c.slot_bytes));
      a.first_slot = s.next_round();
      for (int64_t k = 1; k < m; ++k) s.next_round();
      a.in = in;
      a.out = out;
      a.count = count;
      a.chunk = chunk;
      a.chunks = m;
      a.contributions = n;
      a.nblocks = two_shot_blocks(count, es, n, chunk, c.fused_bytes_per_block, fused_grid_cap(c));
      const cudaError_t e = launch_fused_two_shot(dt, op, a, stream);
      if (e != cudaSuccess) throw EnqueueFailed{e};
    });
  }
  return run_schedule(c, stream, [&](IpcSteps& s) {
    fastpar::allreduce_two_shot(s, CollCall{Coll::kAllreduce, count, dt, -1, int(op), kAuxTwoShot},
                                static_cast<const char*>(in), static_cast<char*>(out), count, dtype_size(dt),
                                s.reducer(dt, op));
  });
}

cudaError_t allreduce_registered(IpcComm& c, DType dt, ReduceOp op, int64_t offset, int64_t count,
                                 cudaStream_t stream) {
  const int64_t es = dtype_size(dt);
  if (offset < 0 || count < 0 || offset + count * es > int64_t(c.registered_bytes)) return cudaErrorInvalidValue;
  if (c.fused_two_shot) {
    // The push, one launch (ipc_fused_collectives.h): two phases, no slot.
    return run_schedule(c, stream, [&](IpcSteps& s) {
      const int n = c.size;
      FusedCollArgs a{};
      a.kind = FusedColl::kAllreduceRegistered;
      a.root = -1;
      a.bytes = count * es;
      const int64_t al = shard_align(es);
      a.piece = ((count + n - 1) / n + al - 1) / al * al * es;  // a shard: split_range's cut
      a.stride = a.piece;
      a.pieces = 1;
      a.phase = ipc_steps::phase_args(
          c, CollCall{Coll::kAllreduce, count, dt, -1, int(op), offset + kAuxFusedRegistered});
      c.seq += 1;  // phases desc.seq and desc.seq + 1
      fused_coll_bind(a, c);
      for (int q = 0; q < n; ++q) a.src[q] = a.dst[q] = s.arena(q) + offset;
      a.contributions = n;
      a.nblocks = fused_coll_blocks(a.piece, a.piece, c.fused_bytes_per_block, fused_grid_cap(c));
      a.slice = fused_coll_slice(a.piece, a.piece, a.nblocks);
      const cudaError_t e = launch_fused_collective(dt, op, a, stream);
      if (e != cudaSuccess) throw EnqueueFailed{e};
    });
  }
  return run_schedule(c, stream, [&](IpcSteps& s) {
    fastpar::allreduce_registered(s, CollCall{Coll::kAllreduce, count, dt, -1, int(op), offset}, offset, count, es,
                                  std::max<int64_t>(1, int64_t(c.slot_bytes) / es), s.reducer(dt, op));
  });
}

cudaError_t agree_registered_ipc(IpcComm& c, int64_t bytes, int64_t offset, cudaStream_t stream) {
  return run_schedule(c, stream, [&](IpcSteps& s) { agree_registered(s, bytes, offset); });
}

cudaError_t allreduce_graphed(IpcComm& c, DType dt, ReduceOp op, const void* in, void* out, int64_t count,
                              cudaStream_t stream, int64_t one_shot_max_bytes) {
  const int64_t es = dtype_size(dt);
  if (count < 1 || count * es > int64_t(c.slot_bytes)) return cudaErrorInvalidValue;
  const int n = c.size;
  // The descriptor's seq is not used (each call's epoch is), and c.seq is
  // not advanced: graphed calls are outside the eager phase numbering.
  GraphRegion g{};
  g.self = graph_control_of(c.bases[c.rank], c.slot_bytes);
  for (int q = 0; q < n; ++q) g.peers[q] = graph_control_of(c.bases[q], c.slot_bytes);
  g.parity_stride = int64_t(slot_stride(c.slot_bytes));
  g.replay_failure = c.host_replay_failure;
  if (prefer_one_shot(count * es, c, one_shot_max_bytes)) {
    // The eager one-shot's schedule and grid (allreduce_one_shot).
    return run_schedule(c, stream, [&](IpcSteps&) {
      GraphArgs a{};
      a.g = g;
      a.f.phase = ipc_steps::phase_args_at(c, CollCall{Coll::kAllreduce, count, dt, -1, int(op), kAuxGraphed}.desc(0));
      for (int q = 0; q < n; ++q) a.f.slots[q] = graph_slot_of(c.bases[q], c.slot_bytes, 0);
      a.f.in = in;
      a.f.out = out;
      a.f.count = count;
      a.f.contributions = n;
      a.f.nblocks = fused_one_shot_blocks(count * es, c.fused_bytes_per_block, fused_grid_cap(c));
      const cudaError_t e = launch_fused_graph(dt, op, a, stream);
      if (e != cudaSuccess) throw EnqueueFailed{e};
    });
  }
  // The eager fused two-shot's schedule, cut and grid (allreduce_two_shot):
  // one chunk, since the call fits a slot.
  return run_schedule(c, stream, [&](IpcSteps&) {
    GraphTwoShotArgs a{};
    a.g = g;
    TwoShotArgs& t = a.t;
    t.phase =
        ipc_steps::phase_args_at(c, CollCall{Coll::kAllreduce, count, dt, -1, int(op), kAuxGraphedTwoShot}.desc(0));
    for (int q = 0; q < n; ++q) t.slot0[q] = graph_slot_of(c.bases[q], c.slot_bytes, 0);
    t.slot_stride = 0;  // one chunk: slot 0 (the parity is GraphRegion's)
    t.first_slot = 0;
    t.in = in;
    t.out = out;
    t.count = count;
    t.chunk = std::max<int64_t>(1, int64_t(c.slot_bytes) / es);
    t.chunks = 1;
    t.contributions = n;
    t.nblocks = two_shot_blocks(count, es, n, t.chunk, c.fused_bytes_per_block, fused_grid_cap(c));
    const cudaError_t e = launch_graph_two_shot(dt, op, a, stream);
    if (e != cudaSuccess) throw EnqueueFailed{e};
  });
}

cudaError_t read_status(const IpcComm& c, cudaStream_t stream, uint32_t* status) {
  const cuda_p2p::ScopedDevice on_device(c.device);
  FASTPAR_CUDA_TRY(on_device.error());
  FASTPAR_CUDA_TRY(cudaMemcpyAsync(status, status_of(c.bases[c.rank]), sizeof(uint32_t), cudaMemcpyDeviceToHost,
                                   stream));
  return cudaStreamSynchronize(stream);
}

}  // namespace cuda_ipc
}  // namespace fastpar
