#include "cuda_ipc_work.h"

#include <ATen/core/ivalue.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <string>
#include <thread>

namespace fastpar {
namespace ops {

void throw_if_ipc_failed(const cuda_ipc::IpcEndpoint& ep, const char* op, int rank, std::chrono::milliseconds timeout) {
  const uint32_t s = ep.host_status();
  if (s == 0) return;
  C10_THROW_ERROR(DistBackendError,
                  std::string("fastpar: ") + op + " over CUDA IPC failed on rank " + std::to_string(rank) + ": " +
                      cuda_ipc::wait_status_text(s) + " (flag-wait timeout " + std::to_string(timeout.count()) +
                      " ms, the group's or the call's timeout); this group's CUDA IPC communicator is unusable, "
                      "destroy the group and create a new one");
}

IpcAllreduceWork::IpcAllreduceWork(std::vector<at::Tensor> outputs, c10::cuda::CUDAStream stream,
                                   std::shared_ptr<const cuda_ipc::IpcEndpoint> endpoint, int rank,
                                   std::chrono::milliseconds timeout, bool blocking_wait)
    : Work(rank, c10d::OpType::ALLREDUCE),
      outputs_(std::move(outputs)),
      stream_(stream),
      endpoint_(std::move(endpoint)),
      rank_(rank),
      timeout_(timeout),
      blocking_wait_(blocking_wait) {
  done_.record(stream_);
}

bool IpcAllreduceWork::isCompleted() { return done_.query(); }

bool IpcAllreduceWork::isSuccess() const { return endpoint_->host_status() == 0; }

bool IpcAllreduceWork::wait(std::chrono::milliseconds timeout) {
  if (blocking_wait_) {
    if (timeout <= ::kNoTimeout) {
      // Bounded anyway: the phase kernels give up at the group's timeout.
      done_.synchronize();
    } else {
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      while (!done_.query()) {
        TORCH_CHECK_WITH(DistBackendError, std::chrono::steady_clock::now() < deadline, "fastpar: all_reduce over CUDA IPC on rank ",
                         rank_, " did not finish within wait(timeout=", timeout.count(), " ms)");
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  } else {
    done_.block(c10::cuda::getCurrentCUDAStream(stream_.device_index()));
  }
  throw_if_ipc_failed(*endpoint_, "all_reduce", rank_, timeout_);
  return true;
}

void IpcAllreduceWork::synchronize() { done_.block(c10::cuda::getCurrentCUDAStream(stream_.device_index())); }

c10::intrusive_ptr<c10::ivalue::Future> IpcAllreduceWork::getFuture() {
  std::lock_guard<std::mutex> g(future_mu_);
  if (!future_) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       std::vector<c10::Device>{stream_.device()});
    // markCompleted records its event on the current stream of the device:
    // make that the kernels' stream, so waiters order after the kernels.
    c10::cuda::CUDAStreamGuard guard(stream_);
    future_->markCompleted(c10::IValue(outputs_));
  }
  return future_;
}

}  // namespace ops
}  // namespace fastpar
