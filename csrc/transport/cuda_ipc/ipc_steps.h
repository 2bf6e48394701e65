// The steps every CUDA IPC schedule is made of (allreduce_ipc.cpp,
// copy_collectives_ipc.cpp): the phase launch with this call's descriptor,
// the status-guarded reduce kernel, and the guarded byte copy out of a peer's
// slot. Host code only (the host emulation compiles it with a fake runtime).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "../../kernels/cuda_reduce_launch.h"
#include "allreduce_ipc.h"
#include "phase_launch.h"

namespace fastpar {
namespace cuda_ipc {
namespace ipc_steps {

inline char* at(void* p, int64_t elems, int64_t ts) { return static_cast<char*>(p) + elems * ts; }
inline const char* at(const void* p, int64_t elems, int64_t ts) { return static_cast<const char*>(p) + elems * ts; }

inline int next_round(IpcComm& c) { return int(c.rounds++ % flags::kSlots); }

// One phase of the protocol with this call's descriptor: `count`, `dtype`,
// `root` and `redop` are what peers compare (-1: not compared / none).
// The phase's arguments for phase number `seq`; phase_args() takes the next
// one (advances c.seq), and phase() launches them.
inline PhaseArgs phase_args_at(const IpcComm& c, IpcOp op, int32_t dtype, int32_t redop, int64_t count,
                               int32_t root, uint64_t seq) {
  PhaseArgs a{};
  a.self = control_of(c.bases[c.rank]);
  for (int q = 0; q < c.size; ++q) a.peers[q] = control_of(c.bases[q]);
  a.status = status_of(c.bases[c.rank]);
  a.host_status = c.host_status;
  a.host_abort = c.host_abort;
  a.desc.seq = seq;
  a.desc.count = count;
  a.desc.aux = -1;
  a.desc.op = int32_t(op);
  a.desc.dtype = dtype;
  a.desc.root = root;
  a.desc.redop = redop;
  a.rank = c.rank;
  a.size = c.size;
  a.timeout_ns = c.timeout_ns;
  return a;
}

inline PhaseArgs phase_args(IpcComm& c, IpcOp op, int32_t dtype, int32_t redop, int64_t count, int32_t root) {
  return phase_args_at(c, op, dtype, redop, count, root, ++c.seq);
}

inline cudaError_t phase(IpcComm& c, IpcOp op, int32_t dtype, int32_t redop, int64_t count, int32_t root,
                         cudaStream_t stream) {
  return launch_phase(phase_args(c, op, dtype, redop, count, root), stream);
}

// The reduce kernel, guarded by this rank's status word: after a failed phase
// it does nothing, so no output is written from a slot a peer never filled.
inline cudaError_t reduce(const IpcComm& c, DType dt, ReduceOp op, const void* const* srcs, int nsrc,
                          void* const* dsts, int ndst, int64_t count, int contributions, cudaStream_t stream) {
  cuda_kernels::ReduceLaunch l;
  for (int i = 0; i < nsrc; ++i) l.srcs[i] = srcs[i];
  for (int i = 0; i < ndst; ++i) l.dsts[i] = dsts[i];
  l.nsrc = nsrc;
  l.ndst = ndst;
  l.count = count;
  l.contributions = contributions;
  l.guard = status_of(c.bases[c.rank]);
  return cuda_kernels::launch_reduce(dt, op, l, stream);
}

// A byte copy out of a peer's slot: the reduce kernel with one source over
// uint8 (exact bits, 16-byte packs where both ends are aligned), guarded like
// the reductions. Why not cudaMemcpyAsync: a copy cannot skip itself after a
// failed phase.
inline cudaError_t guarded_copy(const IpcComm& c, void* dst, const void* src, int64_t bytes, cudaStream_t stream) {
  if (bytes <= 0) return cudaSuccess;
  const void* s[1] = {src};
  void* d[1] = {dst};
  return reduce(c, DType::U8, ReduceOp::SUM, s, 1, d, 1, bytes, 1, stream);
}

inline cudaError_t check_comm(const IpcComm& c) {
  if (c.size < 1 || c.size > kMaxIpcRanks || c.rank < 0 || c.rank >= c.size || c.slot_bytes < 64)
    return cudaErrorInvalidValue;
  for (int q = 0; q < c.size; ++q)
    if (!c.bases[q]) return cudaErrorInvalidValue;
  return cudaSuccess;
}

}  // namespace ipc_steps
}  // namespace cuda_ipc
}  // namespace fastpar
