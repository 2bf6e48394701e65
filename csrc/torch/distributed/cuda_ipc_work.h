// The Work of a collective the c10d CUDA backend ran over CUDA IPC, and the
// IpcLink it checks: the connected communicator plus what watches it.
//
// The kernels were enqueued on the caller's current stream of the tensor's
// device (as vLLM's custom allreduce does), so the host never blocks:
//   wait()         makes the caller's current stream wait on an event recorded
//                  after the kernels (a no-op when it is the same stream; the
//                  event comes from the process-wide event cache, so no
//                  call creates or destroys one),
//                  then raises if this rank's kernels recorded a failure so
//                  far (read from the host-mapped status mirror: no
//                  synchronization). With FASTPAR_BLOCKING_WAIT=1 it
//                  synchronizes the event first, so this call's own failure
//                  is raised (like TORCH_NCCL_BLOCKING_WAIT). When the peer
//                  watcher has seen a peer die it synchronizes too: the
//                  watcher has raised the host abort word, so the kernels end
//                  within a poll, and the error names the dead rank now
//                  instead of at the next call.
//   isCompleted()  queries the event.
//   getFuture()    a CUDA-aware Future over the tensor's device, completed on
//                  the kernels' stream: consumers (DDP comm hooks, then())
//                  synchronize with the kernels, not with the host.
// A failure (timeout, dead or aborted peer, mismatched call) raises
// c10::DistBackendError naming the op, the rank and the timeout
// (cuda_ipc/ipc_failure.h words it).
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

#include "../../core/transport/cuda_ipc/ipc_endpoint.h"
#include "../../core/transport/cuda_ipc/ipc_failure.h"
#include "../../core/transport/liveness/peer_watcher.h"
#include "cuda_event_pool.h"

namespace fastpar {
namespace distributed {

// Whether `stream` is capturing a CUDA graph (then nothing may synchronize it).
inline bool capturing(const c10::cuda::CUDAStream& stream) {
  // Asked with the stream's device current: torch's default stream is the
  // handle 0, which names the legacy stream of whatever device is current.
  const c10::cuda::CUDAGuard guard(stream.device_index());
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream.stream(), &status));
  return status != cudaStreamCaptureStatusNone;
}

// One rank's connected communicator, the watcher of its peers' processes and
// whether abort() was called. Shared by the backend and its Works.
struct IpcLink {
  std::shared_ptr<cuda_ipc::IpcEndpoint> ep;
  liveness::PeerWatcher watcher;
  std::atomic<bool> aborted{false};

  // Starts the watcher: a dead peer raises the host abort word (kPeerDead),
  // so this rank's kernels stop waiting for it, and through this rank's
  // control-block abort word every survivor's kernels stop too.
  void watch(std::vector<int64_t> pids, int rank);
  cuda_ipc::FailureFacts facts() const;
  // A peer died or abort() was called: a wait for this rank's calls blocks
  // the host (bounded: the kernels stop within one poll) so the failure
  // surfaces at once, whatever FASTPAR_BLOCKING_WAIT says.
  bool must_block() const { return watcher.dead_rank() >= 0 || aborted.load(); }
  // Raises DistBackendError if this rank's kernels recorded a failure or
  // abort() was called. A dead peer alone does not raise: a peer that ended
  // after its last call is no failure of calls that completed.
  void throw_if_failed(const char* op, int rank, std::chrono::milliseconds timeout) const;
};

class IpcWork : public c10d::Work {
 public:
  // Records the completion event `done` (from the backend's pool) on
  // `stream`, where the kernels were enqueued; `captured`: `stream` is
  // capturing a CUDA graph (as the engine found when it enqueued them).
  IpcWork(c10d::OpType type, const char* op_name, std::vector<at::Tensor> outputs, c10::cuda::CUDAStream stream,
          bool captured, PooledEvent done, std::shared_ptr<const IpcLink> link, int rank, std::chrono::milliseconds timeout,
          bool blocking_wait);

  bool isCompleted() override;
  bool isSuccess() const override;
  bool wait(std::chrono::milliseconds timeout = ::kNoTimeout) override;
  void synchronize() override;
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  void block_current_stream() const;  // the caller's current stream waits for the kernels
  const char* op_name_;
  std::vector<at::Tensor> outputs_;
  c10::cuda::CUDAStream stream_;
  PooledEvent done_;
  std::shared_ptr<const IpcLink> link_;
  int rank_;
  std::chrono::milliseconds timeout_;
  bool blocking_wait_;
  // Made inside a CUDA graph capture: done_ was recorded in the capture, so
  // it may be waited on only by a stream still capturing, and never queried
  // or synchronized (a replay is ordered by the stream it is replayed on).
  bool captured_;
  std::mutex future_mu_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace distributed
}  // namespace fastpar
