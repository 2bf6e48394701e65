// The Work of an all_reduce the c10d CUDA backend ran over CUDA IPC.
//
// The kernels were enqueued on the caller's current stream of the tensor's
// device (as vLLM's custom allreduce does), so the host never blocks:
//   wait()         makes the caller's current stream wait on an event recorded
//                  after the kernels (a no-op when it is the same stream),
//                  then raises if a flag wait has failed so far (read from the
//                  host-mapped status mirror: no synchronization). With
//                  FASTPAR_BLOCKING_WAIT=1 it synchronizes the event first, so
//                  this call's own failure is raised (like TORCH_NCCL_BLOCKING_WAIT).
//   isCompleted()  queries the event.
//   getFuture()    a CUDA-aware Future over the tensor's device, completed on
//                  the kernels' stream: consumers (DDP comm hooks, then())
//                  synchronize with the kernels, not with the host.
// A failure (timeout, dead or aborted peer, mismatched call) raises
// c10::DistBackendError naming the op, the rank and the timeout.
#pragma once

#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

#include "../transport/cuda_ipc/ipc_endpoint.h"

namespace fastpar {
namespace ops {

// Raises DistBackendError if `ep` recorded a failed flag wait.
void throw_if_ipc_failed(const cuda_ipc::IpcEndpoint& ep, const char* op, int rank, std::chrono::milliseconds timeout);

class IpcAllreduceWork : public c10d::Work {
 public:
  // Records the completion event on `stream` (where the kernels were enqueued).
  IpcAllreduceWork(std::vector<at::Tensor> outputs, c10::cuda::CUDAStream stream,
                   std::shared_ptr<const cuda_ipc::IpcEndpoint> endpoint, int rank, std::chrono::milliseconds timeout,
                   bool blocking_wait);

  bool isCompleted() override;
  bool isSuccess() const override;
  bool wait(std::chrono::milliseconds timeout = ::kNoTimeout) override;
  void synchronize() override;
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  std::vector<at::Tensor> outputs_;
  c10::cuda::CUDAStream stream_;
  c10::cuda::CUDAEvent done_;
  std::shared_ptr<const cuda_ipc::IpcEndpoint> endpoint_;
  int rank_;
  std::chrono::milliseconds timeout_;
  bool blocking_wait_;
  std::mutex future_mu_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace ops
}  // namespace fastpar
