#include "cuda_ipc_work.h"

#include <ATen/core/ivalue.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <optional>
#include <string>
#include <thread>

namespace fastpar {
namespace distributed {

void IpcLink::watch(std::vector<int64_t> pids, int rank) {
  cuda_ipc::IpcEndpoint* e = ep.get();  // outlives the watcher: release_ipc stops it first
  watcher.start(std::move(pids), rank,
                [e](int) { e->raise_host_abort(uint32_t(flags::WaitStatus::kPeerDead)); });
}

cuda_ipc::FailureFacts IpcLink::facts() const {
  cuda_ipc::FailureFacts f;
  f.status = ep->host_status();
  f.dead_rank = watcher.dead_rank();
  f.dead_pid = watcher.pid_of(f.dead_rank);
  f.aborted_here = aborted.load();
  ep->mismatch(&f.mismatch_peer, &f.mine, &f.theirs);
  f.replay_status = ep->replay_failure();
  return f;
}

void IpcLink::throw_if_failed(const char* op, int rank, std::chrono::milliseconds timeout) const {
  const cuda_ipc::FailureFacts f = facts();
  if (f.status == 0 && !f.aborted_here) return;
  C10_THROW_ERROR(DistBackendError, cuda_ipc::failure_message(op, rank, f, timeout.count()));
}

IpcWork::IpcWork(c10d::OpType type, const char* op_name, std::vector<at::Tensor> outputs,
                 c10::cuda::CUDAStream stream, bool captured, PooledEvent done, std::shared_ptr<const IpcLink> link, int rank,
                 std::chrono::milliseconds timeout, bool blocking_wait)
    : Work(rank, type),
      op_name_(op_name),
      outputs_(std::move(outputs)),
      stream_(stream),
      done_(std::move(done)),
      link_(std::move(link)),
      rank_(rank),
      timeout_(timeout),
      blocking_wait_(blocking_wait),
      captured_(captured) {
  done_.record(stream_);
}

bool IpcWork::isCompleted() { return captured_ || done_.query(); }

void IpcWork::block_current_stream() const {
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(stream_.device_index());
  if (!captured_ || capturing(current)) done_.block(current);
}

bool IpcWork::isSuccess() const { return link_->ep->host_status() == 0; }

bool IpcWork::wait(std::chrono::milliseconds timeout) {
  // A dead peer: the watcher raised the host abort word, so this call's
  // kernels end within one poll (microseconds) whether they finish or fail;
  // synchronizing is bounded and lets the failure surface here, in seconds.
  // Never inside a CUDA graph capture, where synchronizing is an error (the
  // captured kernels have not run; a replay's failure shows at the next wait).
  // A timeout given to wait() blocks the host too, as ProcessGroupNCCL's
  // Work does: the caller asked to know within that time.
  const bool sync = (blocking_wait_ || timeout != ::kNoTimeout || link_->must_block()) &&
                    !captured_ && !capturing(c10::cuda::getCurrentCUDAStream(stream_.device_index()));
  if (sync) {
    if (timeout <= ::kNoTimeout) {
      // Bounded anyway: the phase kernels give up at the group's timeout.
      done_.synchronize();
    } else {
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      while (!done_.query()) {
        TORCH_CHECK_WITH(DistBackendError, std::chrono::steady_clock::now() < deadline, "fastpar: ", op_name_,
                         " over CUDA IPC on rank ", rank_, " did not finish within wait(timeout=", timeout.count(),
                         " ms)");
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  } else {
    block_current_stream();
  }
  link_->throw_if_failed(op_name_, rank_, timeout_);
  return true;
}

void IpcWork::synchronize() { block_current_stream(); }

c10::intrusive_ptr<c10::ivalue::Future> IpcWork::getFuture() {
  std::lock_guard<std::mutex> g(future_mu_);
  if (!future_) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       std::vector<c10::Device>{stream_.device()});
    // markCompleted records its event on the current stream of the device:
    // make that a stream which waits for this call's kernels and nothing
    // else. stream_ itself would do only at construction: by now it may hold
    // later work (a p2p stream's next messages), which waiters on the future
    // must not wait for. Inside a capture the event cannot be waited on from
    // a stream outside it, and stream_ is the one place to record.
    std::optional<c10::cuda::CUDAStream> on = stream_;
    if (!captured_) {
      on = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, stream_.device_index());
      done_.block(*on);
    }
    c10::cuda::CUDAStreamGuard guard(*on);
    future_->markCompleted(c10::IValue(outputs_));
  }
  return future_;
}

}  // namespace distributed
}  // namespace fastpar
