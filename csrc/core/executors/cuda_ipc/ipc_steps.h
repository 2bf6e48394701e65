// The steps every CUDA IPC schedule is made of, and IpcSteps: the slot
// transport (core/algorithms/slot_transport.h) that runs the shared schedules of
// algorithms/*_slots.h on the GPU by enqueueing each step on one stream:
//   publish  the guarded copy into this rank's slot
//   phase    the one-thread phase kernel (post our flag with the call's
//            descriptor, wait for every peer's, compare)
//   copy     the byte copy kernel, guarded by the status word
//   reduce   the reduce kernel over the sources in rank order, guarded too
// Stream order is what makes "a rank posts phase p+1 only after its reads of
// phase p" true on the GPU: each phase kernel starts after the kernels before
// it have finished. Host code only (the host emulation compiles it with a
// fake runtime).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "../../transport/collective_call.h"
#include "../../kernels/cuda_reduce_launch.h"
#include "../../transport/cuda_p2p/cuda_try.h"
#include "ipc_allreduce.h"
#include "phase_launch.h"

namespace fastpar {
namespace cuda_ipc {
namespace ipc_steps {

// The phase arguments for descriptor `d` (d.seq: the phase number).
inline PhaseArgs phase_args_at(const IpcComm& c, const flags::OpDesc& d) {
  PhaseArgs a{};
  a.self = control_of(c.bases[c.rank]);
  for (int q = 0; q < c.size; ++q) a.peers[q] = control_of(c.bases[q]);
  a.status = status_of(c.bases[c.rank]);
  a.host_status = c.host_status;
  a.host_abort = c.host_abort;
  a.host_mismatch = c.host_mismatch;
  a.desc = d;
  a.rank = c.rank;
  a.size = c.size;
  a.timeout_ns = c.timeout_ns;
  a.flag_form = c.flag_form;
  return a;
}

// The next phase of `call` (advances c.seq).
inline PhaseArgs phase_args(IpcComm& c, const CollCall& call) { return phase_args_at(c, call.desc(++c.seq)); }

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
  l.gpu_sharers = c.gpu_sharers;
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
  // An earlier call could not be enqueued: this rank is out of step (fail_enqueue).
  return c.enqueue_error;
}

// Clears the calling thread's last error before a call's first launch. The
// launchers return cudaGetLastError(), and an error other code left on this
// thread (not sticky: a failed query nobody checked) would make a launch that
// succeeded look failed after its step was enqueued, and so desynchronize
// this rank for nothing.
inline void clear_stale_error() { cudaGetLastError(); }

// A step of a call could not be enqueued (a launch or copy error). The call
// has taken its numbers by then (phase c.seq, slot round c.rounds, ring
// chunks c.p2p_*), and earlier steps of it may be queued, phases posted: the
// peers wait for the rest, and this rank's next call would be numbered out of
// step with theirs. So the failure ends the communicator, as abort() does:
//   * the host abort word: this rank's queued kernels give up at once and
//     abort its control block (phase_step.h, p2p_ring.h), which ends the
//     peers' waits with kPeerAborted;
//   * the same word copied into the control block's abort word behind them
//     on `stream`, for when none of this rank's kernels is left to do it (it
//     runs once the queued ones have given up); best effort, its error is
//     dropped;
//   * c.enqueue_error: every later call returns it, enqueueing nothing.
// Returns `err`.
inline cudaError_t fail_enqueue(IpcComm& c, cudaError_t err, cudaStream_t stream) {
  if (c.enqueue_error == cudaSuccess) c.enqueue_error = err;
  static const uint64_t kAborted = uint64_t(flags::WaitStatus::kPeerAborted);
  const uint64_t* code = &kAborted;
  if (c.host_abort_host != nullptr) {
    raise_abort_word(c.host_abort_host, kAborted);
    code = c.host_abort_host;  // pinned: the copy is truly asynchronous
  }
  cudaMemcpyAsync(&control_of(c.bases[c.rank])->abort, code, sizeof(uint64_t), cudaMemcpyHostToDevice, stream);
  cudaGetLastError();
  return err;
}

}  // namespace ipc_steps

// Thrown by IpcSteps when a step cannot be enqueued (a launch or copy
// error); run_schedule turns it back into the cudaError_t, after
// ipc_steps::fail_enqueue. A failed wait on the GPU is not an exception: it
// is recorded in the status word and the later guarded steps do nothing.
struct EnqueueFailed {
  cudaError_t err;
};

class IpcSteps {
 public:
  IpcSteps(IpcComm& c, cudaStream_t stream) : c_(c), stream_(stream) {}

  int rank() const { return c_.rank; }
  int size() const { return c_.size; }
  int64_t slot_bytes() const { return int64_t(c_.slot_bytes); }
  char* slot(int q, int k) const { return slot_of(c_.bases[q], c_.slot_bytes, k); }
  // Rank q's registered buffers (ipc_arena.h), as mapped here.
  char* arena(int q) const { return registered_of(c_.bases[q], c_.slot_bytes); }
  int next_round() { return int(c_.rounds++ % flags::kSlots); }

  void phase(const CollCall& call) { enqueue(launch_phase(ipc_steps::phase_args(c_, call), stream_)); }
  // Guarded as the copies are: calls the host enqueued after a failed phase
  // must not rewrite a slot a peer that passed that phase may still read.
  void publish(char* dst, const void* src, int64_t bytes) { copy(dst, src, bytes); }
  void copy(void* dst, const void* src, int64_t bytes) {
    enqueue(ipc_steps::guarded_copy(c_, dst, src, bytes, stream_));
  }

  // The Reducer of the slot schedules for dtype `dt` and op `op`.
  auto reducer(DType dt, ReduceOp op) {
    return [this, dt, op](const void* const* srcs, int nsrc, void* const* dsts, int ndst, int64_t count) {
      if (count > 0) enqueue(ipc_steps::reduce(c_, dt, op, srcs, nsrc, dsts, ndst, count, nsrc, stream_));
    };
  }

 private:
  static void enqueue(cudaError_t e) {
    if (e != cudaSuccess) throw EnqueueFailed{e};
  }
  IpcComm& c_;
  cudaStream_t stream_;
};

// Checks `c`, makes its device current (restored on return; nothing to do
// when it is current already) and runs
// `schedule(IpcSteps&)`: the error of the first step that could not be
// enqueued (which fails the communicator: ipc_steps::fail_enqueue), else
// cudaSuccess.
template <class Schedule>
cudaError_t run_schedule(IpcComm& c, cudaStream_t stream, Schedule&& schedule) {
  FASTPAR_CUDA_TRY(ipc_steps::check_comm(c));
  const cuda_p2p::ScopedDevice on_device(c.device);
  FASTPAR_CUDA_TRY(on_device.error());
  ipc_steps::clear_stale_error();
  IpcSteps steps(c, stream);
  try {
    schedule(steps);
  } catch (const EnqueueFailed& e) {
    return ipc_steps::fail_enqueue(c, e.err, stream);
  }
  return cudaSuccess;
}

}  // namespace cuda_ipc
}  // namespace fastpar
